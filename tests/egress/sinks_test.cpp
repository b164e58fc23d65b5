// The sinks: the checksum against known values and a byte-wise reference, its independence from chunking
// and order, and the raw and .npy files read back byte for byte (and by numpy when it is installed).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "egress_test_support.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/egress/egress.hpp"

namespace ferry::egress {
namespace {

using namespace ferry::egress::testing;
namespace fs = std::filesystem;

// The checksum as the header states it, written independently of the sink: byte by byte, no memcpy.
std::uint64_t reference_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::uint64_t reference_checksum(const std::vector<std::byte>& bytes) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i * 8 < bytes.size(); ++i) {
    std::uint64_t w = 0;
    for (std::size_t k = 0; k < 8 && i * 8 + k < bytes.size(); ++k) {
      w |= static_cast<std::uint64_t>(std::to_integer<unsigned>(bytes[i * 8 + k])) << (8 * k);
    }
    sum += reference_mix(w + i);
  }
  return sum;
}

std::vector<std::byte> le_words(std::initializer_list<std::uint64_t> words) {
  std::vector<std::byte> out;
  for (const std::uint64_t w : words) {
    for (int k = 0; k < 8; ++k) out.push_back(std::byte{static_cast<std::uint8_t>(w >> (8 * k))});
  }
  return out;
}

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> out(n);
  fill_bytes(out, seed);
  return out;
}

// A chunk of `all` as the pipeline would deliver it.
output_chunk chunk_of(const std::vector<std::byte>& all, std::uint64_t tag, std::size_t offset,
                      std::size_t bytes, std::uint32_t index, std::uint32_t chunks) {
  output_chunk d;
  d.tag = tag;
  d.offset = offset;
  d.total_bytes = all.size();
  d.chunk = index;
  d.chunks = chunks;
  d.bytes = std::span<const std::byte>(all.data() + offset, bytes);
  return d;
}

// The chunks of `all` in slots of `slot` bytes.
std::vector<output_chunk> chunks_of(const std::vector<std::byte>& all, std::uint64_t tag, std::size_t slot) {
  const auto n = static_cast<std::uint32_t>((all.size() + slot - 1) / slot);
  std::vector<output_chunk> out;
  for (std::uint32_t c = 0; c < n; ++c) {
    const std::size_t offset = std::size_t{c} * slot;
    out.push_back(chunk_of(all, tag, offset, std::min(slot, all.size() - offset), c, n));
  }
  return out;
}

std::vector<std::byte> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::transform(chars.begin(), chars.end(), out.begin(), [](char c) { return static_cast<std::byte>(c); });
  return out;
}

// A fresh directory under the temporary directory, removed with the object.
class scratch_dir {
 public:
  scratch_dir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("ferry_egress_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1)));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  [[nodiscard]] const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---- checksum ------------------------------------------------------------------------------------

TEST(checksum, known_values) {
  EXPECT_EQ(checksum_of({}), 0u);
  // mix(0) = 0: eight zero bytes, word 0.
  EXPECT_EQ(checksum_of(le_words({0})), 0u);
  // splitmix64's first two outputs from seed 0 are mix(G) and mix(2G), G = 0x9E3779B97F4A7C15; word i
  // adds i before mixing, so word 1 holds 2G - 1.
  constexpr std::uint64_t g = 0x9E3779B97F4A7C15ULL;
  EXPECT_EQ(checksum_of(le_words({g})), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(checksum_of(le_words({g, 2 * g - 1})), 0xE220A8397B1DCDAFULL + 0x6E789E6AA1B965F4ULL);
  // A partial word is zero-padded: bytes 01 02 03 are the word 0x030201.
  const std::vector<std::byte> three{std::byte{1}, std::byte{2}, std::byte{3}};
  EXPECT_EQ(checksum_of(three), 0x31F302F4311C21F1ULL);
  EXPECT_EQ(checksum_of(three), checksum_of(le_words({0x030201})));
}

TEST(checksum, matches_a_byte_wise_reference) {
  for (std::size_t n = 0; n < 80; ++n) {
    const auto bytes = random_bytes(n, n);
    EXPECT_EQ(checksum_of(bytes), reference_checksum(bytes)) << n << " bytes";
  }
  const auto big = random_bytes(MiB + 3, 99);
  EXPECT_EQ(checksum_of(big), reference_checksum(big));
  // Position matters: swapping two words changes the sum.
  EXPECT_NE(checksum_of(le_words({1, 2})), checksum_of(le_words({2, 1})));
}

TEST(checksum_sink, is_independent_of_chunking_and_order) {
  const auto bytes = random_bytes(10007, 5);
  const std::uint64_t whole = checksum_of(bytes);
  std::mt19937_64 rng(17);
  std::uint64_t tag = 0;
  for (const std::size_t slot : {std::size_t{8}, std::size_t{64}, std::size_t{1000}, std::size_t{4096},
                                 std::size_t{10000}, std::size_t{20000}}) {
    checksum_sink sink;
    auto chunks = chunks_of(bytes, tag, slot);
    std::shuffle(chunks.begin(), chunks.end(), rng);
    // Four threads consume the shuffled chunks concurrently, as several sink workers would.
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (std::size_t i = t; i < chunks.size(); i += 4) sink.consume(chunks[i]);
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(sink.completed(), 1u);
    EXPECT_EQ(sink.checksum(tag), whole) << "slots of " << slot << " bytes";
    ++tag;
  }
}

TEST(checksum_sink, rejects_misuse) {
  const auto bytes = random_bytes(100, 1);
  checksum_sink sink;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(sink.checksum(5)); }),
                     "no output with tag 5");
  output_chunk odd = chunk_of(bytes, 1, 4, 8, 0, 2);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { sink.consume(odd); }), "offset 4");
  const auto halves = chunks_of(bytes, 2, 64);
  sink.consume(halves[0]);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(sink.checksum(2)); }), "1 of 2 chunks");
  EXPECT_EQ(sink.completed(), 0u);
  sink.consume(halves[1]);
  EXPECT_EQ(sink.completed(), 1u);
  EXPECT_EQ(sink.checksum(2), checksum_of(bytes));
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { sink.consume(halves[1]); }), "tags must be unique");
  const auto other = random_bytes(50, 2);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { sink.consume(chunks_of(other, 2, 64)[0]); }), "tag 2");
}

// ---- raw_file_sink -------------------------------------------------------------------------------

TEST(raw_file_sink, writes_chunks_at_their_offsets_in_any_order) {
  scratch_dir dir;
  raw_file_sink sink(dir.path(), "raw_");
  EXPECT_EQ(sink.path_of(12), dir.path() / "raw_12.bin");
  const auto bytes = random_bytes(5000, 3);
  // A stale, longer file of the same name is cut to the output's size.
  {
    std::ofstream stale(sink.path_of(12), std::ios::binary);
    stale << std::string(9000, 'x');
  }
  auto chunks = chunks_of(bytes, 12, 1024);
  std::reverse(chunks.begin(), chunks.end());
  for (const auto& c : chunks) sink.consume(c);
  EXPECT_EQ(read_file(sink.path_of(12)), bytes);
}

TEST(raw_file_sink, an_unwritable_path_names_the_path_and_the_reason) {
  scratch_dir dir;
  const fs::path missing = dir.path() / "no_such_dir";
  raw_file_sink sink(missing);
  const auto bytes = random_bytes(64, 1);
  const std::string message =
      message_of<std::system_error>([&] { sink.consume(chunks_of(bytes, 3, 64)[0]); });
  EXPECT_MESSAGE_HAS(message, (missing / "output_3.bin").string());
  EXPECT_MESSAGE_HAS(message, "No such file or directory");
}

// Every name in `dir`, hidden temporaries included.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(raw_file_sink, an_output_appears_under_its_name_only_once_every_chunk_is_written) {
  scratch_dir dir;
  raw_file_sink sink(dir.path());
  const auto bytes = random_bytes(3000, 4);
  const auto chunks = chunks_of(bytes, 5, 1024);
  ASSERT_EQ(chunks.size(), 3u);
  sink.consume(chunks[2]);
  sink.consume(chunks[0]);
  EXPECT_FALSE(fs::exists(sink.path_of(5)));  // two of three chunks: not yet an output
  sink.consume(chunks[1]);
  EXPECT_EQ(read_file(sink.path_of(5)), bytes);
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"output_5.bin"});
}

// A disk that fills: RLIMIT_FSIZE (in a child process, so the limit stays there) makes a chunk's write
// fail with EFBIG after the file was sized. The error must reach the caller naming the path, and no file
// may remain: neither a correctly sized file of zeros under the final name nor the temporary.
void expect_a_failed_write_leaves_no_file(sink& s, const fs::path& dir, const fs::path& final_path,
                                          const std::vector<std::byte>& bytes, std::uint64_t tag) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{16 * 1024, 16 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(3);
    int code = 5;  // every chunk written: the limit did not bite
    for (const auto& c : chunks_of(bytes, tag, 8192)) {
      try {
        s.consume(c);
      } catch (const std::system_error& e) {
        code = std::string(e.what()).find(final_path.string()) != std::string::npos ? 0 : 4;
      }
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: setrlimit failed, 4: the error did not name the file, 5: no error";
  EXPECT_EQ(names_in(dir), std::vector<std::string>{});
}

TEST(raw_file_sink, a_write_error_leaves_no_file_of_zeros_under_the_final_name) {
  scratch_dir dir;
  raw_file_sink sink(dir.path());
  expect_a_failed_write_leaves_no_file(sink, dir.path(), sink.path_of(7), random_bytes(64 * 1024, 5), 7);
}

TEST(npy_sink, a_write_error_leaves_no_file_under_the_final_name) {
  scratch_dir dir;
  npy_sink sink(dir.path(), {16, 1024}, "<f4");
  expect_a_failed_write_leaves_no_file(sink, dir.path(), sink.path_of(2), random_bytes(64 * 1024, 6), 2);
}

// ---- npy_sink ------------------------------------------------------------------------------------

TEST(npy_sink, header_is_numpy_format_1_0_padded_to_64_bytes) {
  scratch_dir dir;
  const npy_sink sink(dir.path(), {64, 21, 512, 512}, "<f4");
  const std::string& h = sink.header();
  ASSERT_EQ(h.size() % 64, 0u);
  ASSERT_GE(h.size(), 10u);
  EXPECT_EQ(h.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t length =
      std::size_t{static_cast<unsigned char>(h[8])} | (std::size_t{static_cast<unsigned char>(h[9])} << 8);
  EXPECT_EQ(length + 10, h.size());
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 21, 512, 512), }";
  EXPECT_EQ(h.substr(10, dict.size()), dict);
  EXPECT_EQ(h.back(), '\n');
  EXPECT_EQ(h.find_first_not_of(' ', 10 + dict.size()), h.size() - 1)
      << "padding must be spaces then a newline";
  EXPECT_EQ(h.size(), 128u);  // 10 + 71 + 1 = 82, rounded up to 128

  EXPECT_NE(npy_sink(dir.path(), {5}, "|u1")
                .header()
                .find("'descr': '|u1', 'fortran_order': False, 'shape': (5,), }"),
            std::string::npos);
  EXPECT_NE(npy_sink(dir.path(), {}, "<f8").header().find("'shape': (), }"), std::string::npos);
  EXPECT_EQ(npy_sink(dir.path(), {3, 4}, "<i8").path_of(9), dir.path() / "output_9.npy");
}

TEST(npy_sink, sizes_come_from_the_dtype_and_unknown_dtypes_are_rejected) {
  scratch_dir dir;
  const auto bytes = random_bytes(48, 1);
  // Six items: 48 bytes of <f8 or <i8, but not of <f4 (24 bytes) or |u1 (6 bytes).
  for (const char* dtype : {"<f8", "<i8", ">u8", "<c8"}) {
    npy_sink fits(dir.path(), {6}, dtype);
    EXPECT_NO_THROW(fits.consume(chunks_of(bytes, 1, 64)[0])) << dtype;
  }
  npy_sink floats(dir.path(), {6}, "<f4");
  const std::string mismatch = message_of<logic_error>([&] { floats.consume(chunks_of(bytes, 1, 64)[0]); });
  EXPECT_MESSAGE_HAS(mismatch, "48 bytes");
  EXPECT_MESSAGE_HAS(mismatch, "needs 24 bytes");
  EXPECT_MESSAGE_HAS(mismatch, "(6,)");
  npy_sink octets(dir.path(), {6}, "|u1");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { octets.consume(chunks_of(bytes, 1, 64)[0]); }),
                     "needs 6 bytes");
  for (const char* dtype : {"", "f4", "<f3", "<x4", "=f4", "<f16", "<f4x", "<i"}) {
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { npy_sink bad(dir.path(), {6}, dtype); }),
                       "unknown dtype \"" + std::string(dtype) + "\"");
  }
}

// ---- sinks behind a pipeline, on every backend ------------------------------------------------------

class egress_sinks : public on_backend {};

// Submits each of `outputs` through a pipeline of small slots (so they are chunked), several workers
// and as_completed delivery, and returns once they are on disk.
void drain(device& dev, std::shared_ptr<sink> out, const std::vector<std::vector<std::byte>>& outputs) {
  options o;
  o.slot_bytes = 64;
  o.slots = 4;
  o.sink_workers = 3;
  o.order = delivery::as_completed;
  std::size_t largest = 0;
  for (const auto& b : outputs) largest = std::max(largest, b.size());
  stream s = dev.make_stream();
  std::vector<buffer> device_bytes;
  buffer staging = dev.alloc_pinned(largest);
  for (const auto& b : outputs) {
    device_bytes.push_back(dev.alloc_device(b.size()));
    std::copy(b.begin(), b.end(), staging.host_bytes());
    dev.copy(device_bytes.back(), staging.view(0, b.size()), s);
  }
  pipeline pipe(dev, std::move(out), o);
  for (std::size_t i = 0; i < outputs.size(); ++i) static_cast<void>(pipe.submit(device_bytes[i], s, i));
  pipe.close();
}

TEST_P(egress_sinks, raw_file_sink_writes_every_output_exactly) {
  with_watchdog(std::chrono::seconds(60), [&] {
    scratch_dir dir;
    auto sink = std::make_shared<raw_file_sink>(dir.path());
    std::vector<std::vector<std::byte>> outputs;
    for (std::size_t i = 0; i < 6; ++i) outputs.push_back(random_bytes(100 + 333 * i, i));
    drain(dev(), sink, outputs);
    for (std::size_t i = 0; i < outputs.size(); ++i) EXPECT_EQ(read_file(sink->path_of(i)), outputs[i]) << i;
  });
}

// Float32 values 0, 0.5, 1, ... of a (4, 3, 5) array, as bytes.
std::vector<std::byte> half_steps(std::size_t n) {
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = 0.5f * static_cast<float>(i);
  const auto* p = reinterpret_cast<const std::byte*>(values.data());
  return {p, p + n * sizeof(float)};
}

TEST_P(egress_sinks, npy_sink_writes_the_header_then_the_data) {
  with_watchdog(std::chrono::seconds(60), [&] {
    scratch_dir dir;
    auto sink = std::make_shared<npy_sink>(dir.path(), std::vector<std::size_t>{4, 3, 5}, "<f4");
    const std::vector<std::vector<std::byte>> outputs{half_steps(60), half_steps(60)};
    drain(dev(), sink, outputs);
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      const auto file = read_file(sink->path_of(i));
      const std::string& h = sink->header();
      ASSERT_EQ(file.size(), h.size() + outputs[i].size());
      EXPECT_TRUE(std::equal(h.begin(), h.end(), file.begin(),
                             [](char c, std::byte b) { return static_cast<std::byte>(c) == b; }));
      const auto data = file.begin() + static_cast<std::ptrdiff_t>(h.size());
      EXPECT_TRUE(std::equal(outputs[i].begin(), outputs[i].end(), data));
    }
  });
}

// The first Python interpreter that can import numpy: the one on PATH, else the system's (a pyenv or
// virtualenv python3 on PATH may lack the distribution's python3-numpy); empty when there is none.
std::string python_with_numpy() {
  for (const std::string python : {"python3", "/usr/bin/python3"}) {
    const std::string probe = python + " -c 'import numpy' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return python;
  }
  return {};
}

TEST_P(egress_sinks, npy_files_load_in_numpy) {
  // The only check that needs something outside the build: CI installs python3-numpy (scripts/setup.sh).
  const std::string python = python_with_numpy();
  if (python.empty()) {
    GTEST_SKIP() << "numpy is missing (neither python3 nor /usr/bin/python3 can import numpy): install "
                    "python3-numpy to run this check";
  }
  with_watchdog(std::chrono::seconds(60), [&] {
    scratch_dir dir;
    auto sink = std::make_shared<npy_sink>(dir.path(), std::vector<std::size_t>{4, 3, 5}, "<f4");
    drain(dev(), sink, {half_steps(60)});
    const std::string script =
        "import numpy, sys; a = numpy.load(sys.argv[1]); "
        "assert a.shape == (4, 3, 5), a.shape; assert a.dtype == numpy.float32, a.dtype; "
        "assert (a.ravel() == numpy.arange(60, dtype=numpy.float32) * 0.5).all(), a";
    const std::string command = python + " -c \"" + script + "\" '" + sink->path_of(0).string() + "'";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
  });
}

INSTANTIATE_TEST_SUITE_P(backends, egress_sinks, ::testing::ValuesIn(backends_under_test()),
                         backend_test_name);

// ---- tags: per-tag state is never shared by two outputs ---------------------------------------------

// `values` as the bytes of float32s.
std::vector<std::byte> floats(std::initializer_list<float> values) {
  std::vector<std::byte> out(values.size() * sizeof(float));
  std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

// `bytes` on the device, written there through a pinned staging buffer.
buffer on_device(device& dev, const std::vector<std::byte>& bytes, const stream& s) {
  buffer staging = dev.alloc_pinned(bytes.size());
  std::copy(bytes.begin(), bytes.end(), staging.host_bytes());
  buffer out = dev.alloc_device(bytes.size());
  dev.copy(out, staging, s);
  return out;
}

// The options of Python's Egress (several sink workers) with small slots.
options small_slots() {
  options o;
  o.slot_bytes = 4096;
  o.slots = 8;
  o.sink_workers = 4;
  return o;
}

// The crash as a user met it, from Python: `for j in range(4): e.submit(torch.ones(4), tag=1)` then
// close(), on a file sink. Two workers shared the tag's staged file and the second to finish committed
// the file the first had already renamed and released: SIGSEGV, every time. Runs in a forked child so
// that a crash fails this test alone; exits 0 when the three repeats were refused at submit naming the
// tag and the first output was written whole, with nothing else left in the directory.
[[noreturn]] void submit_one_tag_four_times(bool npy) {
  const auto fail = [](const std::string& why) {
    std::fprintf(stderr, "%s\n", why.c_str());
    std::fflush(stderr);
    ::_exit(1);
  };
  const fs::path dir =
      fs::temp_directory_path() / ("ferry_tag_test_" + std::to_string(::getpid()) + (npy ? "_npy" : "_raw"));
  int code = 0;
  std::string why;
  try {
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto dev = make_device_under_test(backend::host);
    stream s = dev->make_stream();
    const std::vector<std::byte> ones = floats({1, 1, 1, 1});
    const buffer data = on_device(*dev, ones, s);
    std::shared_ptr<sink> out;
    fs::path written;
    std::vector<std::byte> expected;
    if (npy) {
      auto n = std::make_shared<npy_sink>(dir, std::vector<std::size_t>{4}, "<f4");
      written = n->path_of(1);
      expected.assign(reinterpret_cast<const std::byte*>(n->header().data()),
                      reinterpret_cast<const std::byte*>(n->header().data() + n->header().size()));
      out = n;
    } else {
      auto r = std::make_shared<raw_file_sink>(dir);
      written = r->path_of(1);
      out = r;
    }
    expected.insert(expected.end(), ones.begin(), ones.end());
    std::vector<std::string> refused;
    {
      pipeline pipe(*dev, out, small_slots());
      for (int j = 0; j < 4; ++j) {
        try {
          static_cast<void>(pipe.submit(data, s, 1));
        } catch (const logic_error& e) {
          refused.emplace_back(e.what());
        }
      }
      pipe.close();
    }
    if (refused.size() != 3) {
      code = 1;
      why = fmt::format("{} of 3 repeats of tag 1 were refused at submit", refused.size());
    }
    for (const std::string& m : refused) {
      if (m.find("tag 1 ") == std::string::npos || m.find(written.string()) == std::string::npos) {
        code = 1;
        why = "the refusal names neither tag 1 nor its file: " + m;
      }
    }
    if (code == 0 && read_file(written) != expected) {
      code = 1;
      why = written.string() + " does not hold the output";
    }
    if (code == 0 && names_in(dir) != std::vector<std::string>{written.filename().string()}) {
      code = 1;
      why = "more than " + written.filename().string() + " in the directory";
    }
  } catch (const std::exception& e) {
    code = 1;
    why = std::string("unexpected exception: ") + e.what();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (code != 0) fail(why);
  ::_exit(0);
}

// Named *DeathTest so GoogleTest runs them before any other test starts threads.
TEST(file_sink_tags_DeathTest, npy_sink_refuses_a_repeated_tag_at_submit_instead_of_crashing) {
  EXPECT_EXIT(submit_one_tag_four_times(true), ::testing::ExitedWithCode(0), "");
}

TEST(file_sink_tags_DeathTest, raw_file_sink_refuses_a_repeated_tag_at_submit_instead_of_crashing) {
  EXPECT_EXIT(submit_one_tag_four_times(false), ::testing::ExitedWithCode(0), "");
}

TEST_P(egress_sinks, submits_that_leave_the_tag_at_its_default_are_refused_from_the_second_on) {
  with_watchdog(std::chrono::seconds(60), [&] {
    scratch_dir dir;
    auto out = std::make_shared<raw_file_sink>(dir.path());
    stream s = dev().make_stream();
    const auto first = floats({1, 2});
    const auto second = floats({3, 4, 5});
    const buffer a = on_device(dev(), first, s);
    const buffer b = on_device(dev(), second, s);
    pipeline pipe(dev(), out, small_slots());
    static_cast<void>(pipe.submit(a, s));
    const std::string refused = message_of<logic_error>([&] { static_cast<void>(pipe.submit(b, s)); });
    EXPECT_MESSAGE_HAS(refused, "raw_file_sink: tag 0 was already submitted");
    EXPECT_MESSAGE_HAS(refused, out->path_of(0).string());
    // Refused before anything was queued: the pipeline goes on, and takes the output under a new tag.
    EXPECT_EQ(pipe.stats().outputs, 1u);
    static_cast<void>(pipe.submit(b, s, 5));
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(pipe.try_submit(b, s, 5)); }),
                       "tag 5");
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(pipe.submit_for(a, s, 0, 1s)); }),
                       "tag 0");
    pipe.close();
    EXPECT_EQ(pipe.stats().outputs, 2u);
    EXPECT_EQ(read_file(out->path_of(0)), first);
    EXPECT_EQ(read_file(out->path_of(5)), second);
    EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"output_0.bin", "output_5.bin"}));
  });
}

TEST_P(egress_sinks, a_sink_refuses_a_tag_another_pipeline_gave_it) {
  with_watchdog(std::chrono::seconds(60), [&] {
    scratch_dir dir;
    auto out = std::make_shared<npy_sink>(dir.path(), std::vector<std::size_t>{2}, "<f4");
    stream s = dev().make_stream();
    const buffer a = on_device(dev(), floats({1, 2}), s);
    {
      pipeline first(dev(), out, small_slots());
      static_cast<void>(first.submit(a, s, 3));
      first.close();
    }
    pipeline second(dev(), out, small_slots());
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(second.submit(a, s, 3)); }),
                       "npy_sink: tag 3 was already submitted");
    second.close();
  });
}

TEST_P(egress_sinks, an_npy_output_of_the_wrong_size_is_refused_at_submit_and_keeps_its_tag_free) {
  with_watchdog(std::chrono::seconds(60), [&] {
    scratch_dir dir;
    auto out = std::make_shared<npy_sink>(dir.path(), std::vector<std::size_t>{2}, "<f4");
    stream s = dev().make_stream();
    const buffer wrong = on_device(dev(), floats({1, 2, 3}), s);
    const buffer right = on_device(dev(), floats({4, 5}), s);
    pipeline pipe(dev(), out, small_slots());
    const std::string refused = message_of<logic_error>([&] { static_cast<void>(pipe.submit(wrong, s, 0)); });
    EXPECT_MESSAGE_HAS(refused, "12 bytes");
    EXPECT_MESSAGE_HAS(refused, "needs 8 bytes");
    static_cast<void>(pipe.submit(right, s, 0));  // the pipeline did not fail, and tag 0 is still free
    pipe.close();
    const auto file = read_file(out->path_of(0));
    ASSERT_EQ(file.size(), out->header().size() + 8);
    EXPECT_TRUE(std::equal(file.begin() + static_cast<std::ptrdiff_t>(out->header().size()), file.end(),
                           floats({4, 5}).begin()));
  });
}

TEST_P(egress_sinks, checksum_sink_refuses_a_repeated_tag_at_submit) {
  with_watchdog(std::chrono::seconds(60), [&] {
    auto sums = std::make_shared<checksum_sink>();
    stream s = dev().make_stream();
    // Larger than a slot, so each output is chunked: the chunks of one output share its checksum.
    std::vector<std::byte> big(3 * small_slots().slot_bytes + 8);
    fill_bytes(big, 7);
    const buffer a = on_device(dev(), big, s);
    pipeline pipe(dev(), sums, small_slots());
    static_cast<void>(pipe.submit(a, s, 9));
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(pipe.submit(a, s, 9)); }),
                       "checksum_sink: tag 9 was already submitted");
    pipe.close();
    EXPECT_EQ(sums->completed(), 1u);
    EXPECT_EQ(sums->checksum(9), checksum_of(big));
  });
}

// Chunks handed to a file sink directly (not through a pipeline, which admits each tag once): a chunk of
// another output under a tag being written is an error naming the tag, and the output being written
// still completes.
TEST(raw_file_sink, a_chunk_of_another_output_under_the_same_tag_is_refused) {
  scratch_dir dir;
  raw_file_sink sink(dir.path());
  const auto bytes = random_bytes(2048, 8);
  auto chunks = chunks_of(bytes, 4, 1024);
  ASSERT_EQ(chunks.size(), 2u);
  sink.consume(chunks[0]);
  output_chunk other = chunks[1];
  other.sequence = 1;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { sink.consume(other); }),
                     "tag 4 is being written for output 0");
  output_chunk one_chunk = chunks_of(bytes, 4, 4096)[0];
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { sink.consume(one_chunk); }), "tag 4");
  sink.consume(chunks[1]);
  EXPECT_EQ(read_file(sink.path_of(4)), bytes);
}

}  // namespace
}  // namespace ferry::egress
