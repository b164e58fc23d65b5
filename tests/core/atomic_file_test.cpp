#include "ferry/core/atomic_file.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/text.hpp"

namespace {

namespace fs = std::filesystem;

// A fresh empty directory, removed with its content at the end of the test.
class temp_dir {
 public:
  temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "ferry_atomic_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    EXPECT_NE(::mkdtemp(buf.data()), nullptr);
    path_ = buf.data();
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, ec);
    fs::remove_all(path_, ec);
  }
  [[nodiscard]] const fs::path& path() const { return path_; }
  // Every name in the directory, hidden ones included.
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    return out;
  }

 private:
  fs::path path_;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string pattern_text(std::size_t bytes) {
  std::string s(bytes, '\0');
  for (std::size_t i = 0; i < bytes; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 26) % 26);
  return s;
}

TEST(atomic_file, a_committed_file_holds_every_byte_and_no_temporary_is_left) {
  temp_dir d;
  const std::string text = pattern_text(300'000);
  ferry::write_file_atomically(d.path() / "out.json", text);
  EXPECT_EQ(read_all(d.path() / "out.json"), text);
  EXPECT_EQ(d.names(), std::vector<std::string>{"out.json"});
}

TEST(atomic_file, the_final_name_is_untouched_until_commit_and_after_an_abandoned_write) {
  temp_dir d;
  const fs::path p = d.path() / "trace.json";
  ferry::write_file_atomically(p, "old content");
  {
    ferry::atomic_file f(p);
    f.write(pattern_text(4096));
    EXPECT_EQ(read_all(p), "old content");  // the new bytes live under the temporary only
    EXPECT_TRUE(fs::exists(f.temp_path()));
    EXPECT_EQ(f.temp_path().parent_path(), d.path());
    EXPECT_EQ(f.temp_path().filename().string().rfind(".trace.json.", 0), 0u);
  }  // destroyed without commit: the write is abandoned
  EXPECT_EQ(read_all(p), "old content");
  EXPECT_EQ(d.names(), std::vector<std::string>{"trace.json"});
}

TEST(atomic_file, pwrite_at_offsets_in_any_order_then_commit) {
  temp_dir d;
  const fs::path p = d.path() / "out.bin";
  const std::string text = pattern_text(10'000);
  ferry::atomic_file f(p);
  f.truncate(text.size());
  const auto bytes = std::as_bytes(std::span<const char>(text.data(), text.size()));
  f.pwrite(bytes.subspan(6000), 6000);
  f.pwrite(bytes.subspan(0, 6000), 0);
  EXPECT_FALSE(fs::exists(p));
  f.commit();
  EXPECT_EQ(read_all(p), text);
  EXPECT_TRUE(f.temp_path().empty());
  EXPECT_EQ(d.names(), std::vector<std::string>{"out.bin"});
}

// A disk that fills up: RLIMIT_FSIZE makes writes past 64 KiB fail with EFBIG, in a child process so the
// limit does not reach the test runner. The error must reach the caller and leave no file at all.
TEST(atomic_file, a_write_error_reaches_the_caller_and_leaves_neither_final_nor_temporary_file) {
  temp_dir d;
  const fs::path p = d.path() / "report.html";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(3);
    try {
      ferry::write_file_atomically(p, pattern_text(1 << 20));
    } catch (const std::system_error& e) {
      const std::string what = e.what();
      ::_exit(what.find(p.string()) != std::string::npos ? 0 : 4);
    }
    ::_exit(5);  // the write succeeded beyond the limit: the test cannot show anything
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: setrlimit failed, 4: the error did not name the path, 5: no error";
  EXPECT_TRUE(d.names().empty()) << "left behind: " << (d.names().empty() ? "" : d.names()[0]);
}

TEST(atomic_file, a_missing_directory_fails_at_once_naming_the_path) {
  temp_dir d;
  const fs::path p = d.path() / "missing" / "out.json";
  try {
    ferry::atomic_file f(p);
    FAIL() << "created a file in a missing directory";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
}

TEST(atomic_file, remove_unfinished_files_removes_live_temporaries) {
  temp_dir d;
  ferry::atomic_file f(d.path() / "a.json");
  f.write(std::string_view("partial"));
  ASSERT_TRUE(fs::exists(f.temp_path()));
  ferry::remove_unfinished_files();
  EXPECT_TRUE(d.names().empty());
}

TEST(check_output_path, accepts_a_writable_directory_and_leaves_nothing_there) {
  temp_dir d;
  EXPECT_NO_THROW(ferry::check_output_path(d.path() / "t.json", "--trace"));
  EXPECT_TRUE(d.names().empty());
}

TEST(check_output_path, refuses_missing_directories_files_as_directories_and_directories_as_files) {
  temp_dir d;
  ferry::write_file_atomically(d.path() / "file", "x");
  const std::vector<std::pair<fs::path, std::string>> bad{
      {d.path() / "missing" / "t.json", "does not exist"},
      {d.path() / "file" / "t.json", "is not a directory"},
      {d.path(), "is a directory"},
      {"", "empty"},
  };
  for (const auto& [path, why] : bad) {
    try {
      ferry::check_output_path(path, "--trace");
      ADD_FAILURE() << path << " accepted";
    } catch (const ferry::logic_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--trace"), std::string::npos) << what;
      EXPECT_NE(what.find(why), std::string::npos) << what;
      EXPECT_NE(what.find(path.string()), std::string::npos) << what;
    }
  }
}

TEST(check_output_path, refuses_a_directory_it_cannot_write) {
  temp_dir d;
  const fs::path ro = d.path() / "ro";
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  // root ignores permission bits; /proc refuses new files to everyone.
  const fs::path dir = ::geteuid() == 0 ? fs::path("/proc") : ro;
  EXPECT_THROW(ferry::check_output_path(dir / "t.json", "--json-file"), ferry::logic_error);
  EXPECT_THROW(ferry::atomic_file(dir / "t.json"), std::system_error);
}

TEST(escape_control, terminal_escapes_in_names_are_printed_as_text) {
  EXPECT_EQ(ferry::escape_control("\x1b[2Jkernel"), "\\x1b[2Jkernel");
  EXPECT_EQ(ferry::escape_control("a\nb\tc\x7f"), "a\\x0ab\\x09c\\x7f");
  EXPECT_EQ(ferry::escape_control("a\nb\tc", true), "a\nb\tc");
  EXPECT_EQ(ferry::escape_control("\xc2\x9b"
                                  "31m"),
            "\\u009b31m");  // C1 CSI in UTF-8
  EXPECT_EQ(ferry::escape_control("caf\xc3\xa9 \xe2\x86\x92 ok"), "caf\xc3\xa9 \xe2\x86\x92 ok");
}

}  // namespace
