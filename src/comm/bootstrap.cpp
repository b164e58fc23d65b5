// The bootstraps of ferry::comm: a single process, and MPI (Open MPI through ferry::shim) on
// MPI_COMM_WORLD.
#include "ferry/comm/bootstrap.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "ferry/comm/communicator.hpp"
#include "ferry/core/error.hpp"
#include "ferry/shim/mpi.hpp"

namespace ferry::comm {
namespace {

class single_process final : public bootstrap {
 public:
  [[nodiscard]] int rank() const noexcept override { return 0; }
  [[nodiscard]] int size() const noexcept override { return 1; }
  [[nodiscard]] std::string_view name() const noexcept override { return "single"; }
  [[nodiscard]] std::string transport() const override { return "this process"; }
  void broadcast(std::span<std::byte> /*bytes*/, int root) override {
    FERRY_EXPECTS(root == 0,
                  fmt::format("bootstrap broadcast from root {}: a job of 1 process has root 0 only", root));
  }
  [[nodiscard]] std::vector<std::byte> all_gather(std::span<const std::byte> mine) override {
    return {mine.begin(), mine.end()};
  }
};

// MPI is initialized once per process and cannot start again once finalized: when ferry initialized it,
// it finalizes it when the process exits (as mpi4py does), so a program may make and drop bootstraps freely.
std::mutex& mpi_mutex() {
  static std::mutex mu;
  return mu;
}

void finalize_mpi_at_exit() noexcept {
  const shim::mpi_api& api = shim::mpi();
  int finalized = 0;
  if (api.finalized(&finalized) != shim::mpi_success || finalized != 0) return;
  const int r = api.finalize();
  FERRY_ASSERT_NOTHROW(r == shim::mpi_success, "MPI_Finalize at exit failed: " + api.error_text(r));
}

class mpi_job final : public bootstrap {
 public:
  mpi_job() : api_(shim::mpi()) {
    if (!api_.ok()) throw comm_error("make_mpi_bootstrap: " + api_.error, collective::barrier, -1);
    {
      const std::lock_guard lock(mpi_mutex());
      int finalized = 0;
      check(api_.finalized(&finalized), "MPI_Finalized");
      if (finalized != 0)
        throw comm_error(
            "make_mpi_bootstrap: MPI was already finalized in this process; it cannot start again",
            collective::barrier, -1);
      int initialized = 0;
      check(api_.initialized(&initialized), "MPI_Initialized");
      if (initialized == 0) {
        int provided = 0;
        check(api_.init_thread(nullptr, nullptr, shim::mpi_thread_serialized, &provided), "MPI_Init_thread");
        FERRY_EXPECTS(std::atexit(finalize_mpi_at_exit) == 0,
                      "make_mpi_bootstrap: atexit refused the finalizer");
      }
    }
    // Errors come back to ferry as codes (the default would end the job inside the failing call).
    check(api_.comm_set_errhandler(api_.comm_world, api_.errors_return), "MPI_Comm_set_errhandler");
    check(api_.comm_rank(api_.comm_world, &rank_), "MPI_Comm_rank");
    check(api_.comm_size(api_.comm_world, &size_), "MPI_Comm_size");
  }

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] std::string_view name() const noexcept override { return "mpi"; }
  [[nodiscard]] std::string transport() const override { return api_.version_string(); }

  void broadcast(std::span<std::byte> bytes, int root) override {
    FERRY_EXPECTS(
        root >= 0 && root < size_,
        fmt::format("bootstrap broadcast from root {}: the job's processes are 0 to {}", root, size_ - 1));
    check(api_.bcast(bytes.data(), count(bytes.size()), api_.byte, root, api_.comm_world), "MPI_Bcast");
  }
  [[nodiscard]] std::vector<std::byte> all_gather(std::span<const std::byte> mine) override {
    std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(size_));
    const int n = count(mine.size());
    check(api_.allgather(mine.data(), n, api_.byte, all.data(), n, api_.byte, api_.comm_world),
          "MPI_Allgather");
    return all;
  }

 private:
  void check(int code, const char* call) const {
    if (code == shim::mpi_success) return;
    throw comm_error(
        fmt::format("{} on process {} of {} failed: {}", call, rank_, size_, api_.error_text(code)),
        collective::barrier, rank_);
  }
  static int count(std::size_t bytes) {
    FERRY_EXPECTS(
        bytes <= static_cast<std::size_t>(INT_MAX),
        fmt::format("bootstrap message of {} bytes: MPI counts are limited to {} bytes", bytes, INT_MAX));
    return static_cast<int>(bytes);
  }

  const shim::mpi_api& api_;
  int rank_ = -1;
  int size_ = 0;
};

// The store of make_memory_store: a map under a mutex, and a condition variable for the waits.
class memory_store final : public key_value_store {
 public:
  void set(const std::string& key, std::span<const std::byte> value) override {
    {
      const std::lock_guard lock(mu_);
      values_[key].assign(value.begin(), value.end());
    }
    cv_.notify_all();
  }
  bool get(const std::string& key, std::span<std::byte> out, std::chrono::milliseconds wait) override {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return values_.contains(key); })) return false;
    const std::vector<std::byte>& v = values_.at(key);
    FERRY_EXPECTS(
        v.size() == out.size(),
        fmt::format("memory store: key '{}' holds {} bytes, {} were expected", key, v.size(), out.size()));
    std::copy(v.begin(), v.end(), out.begin());
    return true;
  }
  void erase(const std::string& key) override {
    const std::lock_guard lock(mu_);
    values_.erase(key);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<std::byte>> values_;
};

// A job over a key-value store. A collective number k (this process's count of collectives before it, the
// same on every process by the bootstrap's contract) writes its part under <prefix>/<k>/<rank> and reads
// the parts it needs. Waits go in slices, so an abort posted under <prefix>/abort (a fixed-size text:
// store reads need the length) is seen within a slice of its posting.
class store_job final : public bootstrap {
 public:
  static constexpr std::size_t abort_bytes = 512;
  static constexpr std::chrono::milliseconds slice{100};

  store_job(std::shared_ptr<key_value_store> store, int rank, int size, std::string prefix,
            std::chrono::milliseconds timeout)
      : store_(std::move(store)), rank_(rank), size_(size), prefix_(std::move(prefix)), timeout_(timeout) {}

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] std::string_view name() const noexcept override { return "store"; }
  [[nodiscard]] std::string transport() const override {
    return fmt::format("a key-value store (keys under '{}')", prefix_);
  }

  void broadcast(std::span<std::byte> bytes, int root) override {
    FERRY_EXPECTS(
        root >= 0 && root < size_,
        fmt::format("bootstrap broadcast from root {}: the job's processes are 0 to {}", root, size_ - 1));
    const std::uint64_t k = next_++;
    if (rank_ == root) {
      put(k, bytes);
    } else {
      wait_for(k, root, bytes, "broadcast");
    }
  }

  [[nodiscard]] std::vector<std::byte> all_gather(std::span<const std::byte> mine) override {
    const std::uint64_t k = next_++;
    put(k, mine);
    std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(size_));
    for (int p = 0; p < size_; ++p) {
      const std::span<std::byte> part(all.data() + static_cast<std::size_t>(p) * mine.size(), mine.size());
      if (p == rank_) {
        std::copy(mine.begin(), mine.end(), part.begin());
      } else {
        wait_for(k, p, part, "all_gather");
      }
    }
    // Every process wrote its part of k after it finished every earlier collective, reads included: the
    // keys this process wrote before k are read everywhere.
    forget_before(k);
    return all;
  }

  void abort(const std::string& why) noexcept override {
    try {
      std::vector<std::byte> text(abort_bytes);
      const std::string said = fmt::format("process {} of {}: {}", rank_, size_, why);
      std::memcpy(text.data(), said.data(), std::min(said.size(), abort_bytes - 1));
      store_->set(prefix_ + "/abort", text);
    } catch (...) {
      // The store is gone too: the others find out at their timeout.
    }
  }

 private:
  [[nodiscard]] std::string key_of(std::uint64_t k, int p) const {
    return fmt::format("{}/{}/{}", prefix_, k, p);
  }

  void put(std::uint64_t k, std::span<const std::byte> bytes) {
    const std::string key = key_of(k, rank_);
    try {
      store_->set(key, bytes);
    } catch (const std::exception& e) {
      throw comm_error(
          fmt::format("bootstrap collective #{} on process {} of {}: writing key '{}' to the store "
                      "failed: {}",
                      k, rank_, size_, key, e.what()),
          collective::barrier, rank_);
    }
    written_.push_back(k);
  }

  void wait_for(std::uint64_t k, int p, std::span<std::byte> out, std::string_view what) {
    const std::string key = key_of(k, p);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    auto fail = [&](const std::string& why) {
      return comm_error(fmt::format("bootstrap {} #{} on process {} of {}: {}", what, k, rank_, size_, why),
                        collective::barrier, rank_);
    };
    for (;;) {
      // Rounded up: a truncated remainder would give up to 1 ms before the timeout.
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      try {
        if (store_->get(key, out, std::clamp(left, std::chrono::milliseconds(0), slice))) return;
      } catch (const std::exception& e) {
        throw fail(
            fmt::format("reading process {}'s part (key '{}') from the store failed: {}", p, key, e.what()));
      }
      std::vector<std::byte> text(abort_bytes);
      bool aborted = false;
      try {
        aborted = store_->get(prefix_ + "/abort", text, std::chrono::milliseconds(0));
      } catch (const std::exception&) {
        aborted = false;  // the abort key's read failing is not the collective failing
      }
      if (aborted) {
        const auto* c = reinterpret_cast<const char*>(
            text.data());  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
        throw fail(fmt::format("the job was aborted by {}", std::string(c, strnlen(c, abort_bytes))));
      }
      if (left.count() <= 0)
        throw fail(
            fmt::format("process {} did not write its part within {} ms (key '{}' is not in the store): "
                        "it died, gave up or is behind",
                        p, timeout_.count(), key));
    }
  }

  void forget_before(std::uint64_t k) noexcept {
    auto last = written_.begin();
    for (; last != written_.end() && *last < k; ++last) {
      try {
        store_->erase(key_of(*last, rank_));
      } catch (...) {
        // A key left behind costs the store a few bytes, nothing else.
      }
    }
    written_.erase(written_.begin(), last);
  }

  std::shared_ptr<key_value_store> store_;
  int rank_;
  int size_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  std::uint64_t next_ = 0;
  std::vector<std::uint64_t> written_;  // collectives whose key this process wrote and has not erased
};

bool env_set(const char* name) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): nothing in ferry changes the environment
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "unknown-host";
  return {name.data()};
}

}  // namespace

std::unique_ptr<bootstrap> make_single_process_bootstrap() { return std::make_unique<single_process>(); }

bool mpi_available(std::string* reason) {
  const shim::mpi_api& api = shim::mpi();
  if (reason != nullptr) *reason = api.ok() ? std::string() : api.error;
  return api.ok();
}

bool launched_by_mpi() {
  return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_RANK");
}

std::unique_ptr<bootstrap> make_mpi_bootstrap() { return std::make_unique<mpi_job>(); }

std::shared_ptr<key_value_store> make_memory_store() { return std::make_shared<memory_store>(); }

std::unique_ptr<bootstrap> make_store_bootstrap(std::shared_ptr<key_value_store> store, int rank, int size,
                                                std::string prefix, std::chrono::milliseconds timeout) {
  FERRY_EXPECTS(store != nullptr, "make_store_bootstrap: the store is null");
  FERRY_EXPECTS(size >= 1,
                fmt::format("make_store_bootstrap: a job of {} processes; it has at least 1", size));
  FERRY_EXPECTS(rank >= 0 && rank < size,
                fmt::format("make_store_bootstrap: rank {} of a job of {} processes: ranks are 0 to {}", rank,
                            size, size - 1));
  FERRY_EXPECTS(!prefix.empty(),
                "make_store_bootstrap: the key prefix is empty; give one the job's other "
                "users of the store do not use (\"ferry/0\")");
  FERRY_EXPECTS(timeout.count() > 0,
                fmt::format("make_store_bootstrap: timeout {} ms must be positive", timeout.count()));
  return std::make_unique<store_job>(std::move(store), rank, size, std::move(prefix), timeout);
}

std::unique_ptr<bootstrap> make_bootstrap(std::string_view name) {
  if (name == "single") return make_single_process_bootstrap();
  if (name == "mpi") return make_mpi_bootstrap();
  if (name == "auto") return launched_by_mpi() ? make_mpi_bootstrap() : make_single_process_bootstrap();
  FERRY_EXPECTS(false, fmt::format("bootstrap '{}': expected single, mpi or auto", name));
  return {};
}

std::vector<std::string> all_gather_text(bootstrap& job, std::string_view mine) {
  const auto length = static_cast<std::uint64_t>(mine.size());
  std::array<std::byte, sizeof length> mine_length{};
  std::memcpy(mine_length.data(), &length, sizeof length);
  const std::vector<std::byte> lengths_raw = job.all_gather(mine_length);
  const auto n = static_cast<std::size_t>(job.size());
  std::vector<std::uint64_t> lengths(n);
  std::memcpy(lengths.data(), lengths_raw.data(), n * sizeof length);
  const std::uint64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<std::byte> padded(static_cast<std::size_t>(longest));
  std::copy_n(reinterpret_cast<const std::byte*>(mine.data()),
              mine.size(),  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
              padded.begin());
  const std::vector<std::byte> all = job.all_gather(padded);
  std::vector<std::string> texts(n);
  for (std::size_t p = 0; p < n; ++p) {
    const auto* begin = reinterpret_cast<const char*>(
        all.data() + p * longest);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    texts[p].assign(begin, static_cast<std::size_t>(lengths[p]));
  }
  return texts;
}

host_place place_on_host(bootstrap& job) {
  host_place place;
  place.host = host_name();
  const std::vector<std::string> hosts = all_gather_text(job, place.host);
  const auto me = static_cast<std::size_t>(job.rank());
  place.local_rank = static_cast<int>(
      std::count(hosts.begin(), hosts.begin() + static_cast<std::ptrdiff_t>(me), place.host));
  place.local_size = static_cast<int>(std::count(hosts.begin(), hosts.end(), place.host));
  return place;
}

void agree_ready(bootstrap& job, std::string_view what, const std::string& problem) {
  const std::vector<std::string> all = all_gather_text(job, problem);
  // Each reason once, with the processes that gave it, in order of the first to give it.
  std::vector<std::pair<std::string, std::vector<std::size_t>>> reasons;
  std::size_t failed = 0;
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (all[p].empty()) continue;
    ++failed;
    const auto same =
        std::find_if(reasons.begin(), reasons.end(), [&](const auto& r) { return r.first == all[p]; });
    if (same != reasons.end()) {
      same->second.push_back(p);
    } else {
      reasons.emplace_back(all[p], std::vector<std::size_t>{p});
    }
  }
  if (failed == 0) return;
  std::string failures;
  for (const auto& [why, processes] : reasons) {
    failures += fmt::format("{}{} {} of {}: {}", failures.empty() ? "" : "; ",
                            processes.size() == 1 ? "process" : "processes", fmt::join(processes, ", "),
                            all.size(), why);
  }
  throw comm_error(fmt::format("{} over {} {} failed on {} of them: {}", what, all.size(),
                               all.size() == 1 ? "process" : "processes", failed, failures),
                   collective::barrier, -1);
}

}  // namespace ferry::comm
