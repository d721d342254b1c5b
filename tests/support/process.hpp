// Process-level test helpers: temp directories, file text, and child processes (shoald,
// shoal) with their output in files. Every wait is bounded; a child left running is killed.
#pragma once

#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace shoal::test {

namespace fs = std::filesystem;

inline std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  REQUIRE(f.good());
}

// A fresh directory under /tmp, removed with everything in it.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "shoal_test.XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// One child process with stdout and stderr redirected to files.
struct child_process {
  pid_t pid = -1;
  fs::path out, err;
  std::optional<int> status;  // exit code (128 + signal when killed), once reaped

  // The child dies with the test process (PR_SET_PDEATHSIG) when started from the main thread,
  // so a test killed at its timeout leaves no daemon behind to slow the tests after it. The
  // signal follows the thread that forks, hence not from other threads.
  child_process(std::vector<std::string> args, const fs::path& out_file, const fs::path& err_file)
      : out(out_file), err(err_file) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const bool main_thread = ::gettid() == parent;
    int ready[2];  // closed on exec; a byte (errno) arrives only when exec failed
    REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
    pid = ::fork();
    REQUIRE_MESSAGE(pid >= 0, "cannot fork for " << args[0]);
    if (pid == 0) {  // async-signal-safe calls only from here on
      if (main_thread) ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      int in = ::open("/dev/null", O_RDONLY);
      int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (in < 0 || o < 0 || e < 0 || ::dup2(in, 0) < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) {
        int why = errno;
        (void)!::write(ready[1], &why, sizeof why);
        ::_exit(127);
      }
      ::execve(argv[0], argv.data(), environ);
      int why = errno;
      (void)!::write(ready[1], &why, sizeof why);
      ::_exit(127);
    }
    ::close(ready[1]);
    int why = 0;
    const bool failed = ::read(ready[0], &why, sizeof why) == static_cast<ssize_t>(sizeof why);
    ::close(ready[0]);
    if (failed) {
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    REQUIRE_MESSAGE(!failed, "cannot start " << args[0] << ": " << std::strerror(why));
  }

  ~child_process() {
    if (pid > 0 && !status) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

  // Reaps the process if it has exited; true then.
  bool exited() {
    if (status) return true;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) != pid) return false;
    status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return true;
  }

  // The exit code within `timeout`, or nullopt (the process is then still running).
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exited() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return status;
  }
};

// A TCP port that was free a moment ago (bound to port 0, then released).
// A loopback port nobody listens on, taken below the kernel's ephemeral range (32768–60999
// by default) so that no outgoing connection or port-0 bind elsewhere (CAF's, a storage
// node's bulk server) takes it before the test's process binds it; never the same twice in
// one process.
inline uint16_t free_port() {
  static std::mt19937 rng(std::random_device{}() ^ static_cast<uint32_t>(::getpid()));
  static std::set<uint16_t> given;
  for (int attempt = 0; attempt < 2000; ++attempt) {
    auto p = static_cast<uint16_t>(20000 + rng() % 12000);
    if (given.contains(p)) continue;
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(p);
    bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) {
      given.insert(p);
      return p;
    }
  }
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);  // fallback: whatever the kernel picks
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace shoal::test
