// fabric_transport over the providers this machine has (shm, tcp;ofi_rxm on loopback): reads
// of registered memory are bit-exact, whole and in pieces, between two endpoints of one
// process and between two processes; changed bytes fail the checksum; an unusable provider,
// a foreign address, a wrong-sized destination and a gone owner are clear errors, never a hang.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "storage/crc32c.hpp"
#include "transport/fabric_transport.hpp"

using namespace shoal;
using transport::fabric_config;
using transport::fabric_transport;

namespace {

const fabric_config providers[] = {{"shm", ""}, {"tcp;ofi_rxm", "127.0.0.1"}};

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

std::unique_ptr<fabric_transport> make(const fabric_config& c) {
  auto t = fabric_transport::create(c);
  REQUIRE_MESSAGE(t, (t ? "" : t.error()));
  return std::move(*t);
}

// Waits (bounded) for a transfer; false if it did not end within `limit`.
bool settle(const runtime::transfer& t, std::chrono::seconds limit = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!t.done() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return t.done();
}

}  // namespace

TEST_CASE("fabric transport: reads are bit-exact whole and in pieces, changed bytes fail the checksum") {
  for (const auto& cfg : providers) {
    CAPTURE(cfg.provider);
    auto bytes = random_bytes((4 << 20) + 123, 7);  // outlives the endpoints (see read_all's case)
    auto owner = make(cfg);
    auto reader = make(cfg);
    CHECK(owner->name() == "libfabric " + cfg.provider);
    auto reg = owner->register_memory(bytes);
    REQUIRE_MESSAGE(reg, (reg ? "" : reg.error()));
    for (auto [off, len] : {std::pair<uint64_t, uint64_t>{0, bytes.size()}, {4096, 1 << 20}, {bytes.size() - 5, 5}}) {
      CAPTURE(off);
      auto desc = (*reg)->describe(off, len);
      CHECK(desc.length == len);
      CHECK(desc.owner == owner->address());
      std::vector<std::byte> dst(len);
      auto t = reader->read(desc, dst, std::chrono::seconds(5));
      REQUIRE(settle(*t));
      CHECK_MESSAGE(t->ok(), t->error());
      CHECK(std::memcmp(dst.data(), bytes.data() + off, len) == 0);
    }
    // Several reads in flight at once.
    std::vector<std::vector<std::byte>> dsts(8, std::vector<std::byte>(256 << 10));
    std::vector<std::shared_ptr<runtime::transfer>> ts;
    for (size_t i = 0; i < dsts.size(); ++i)
      ts.push_back(reader->read((*reg)->describe(i * (256 << 10), 256 << 10), dsts[i], std::chrono::seconds(5)));
    for (size_t i = 0; i < dsts.size(); ++i) {
      REQUIRE(settle(*ts[i]));
      CHECK_MESSAGE(ts[i]->ok(), ts[i]->error());
      CHECK(std::memcmp(dsts[i].data(), bytes.data() + i * (256 << 10), 256 << 10) == 0);
    }
    // The owner changed the bytes after describing them: the read is refused, not trusted.
    auto desc = (*reg)->describe(0, 1000);
    bytes[10] ^= std::byte{1};
    std::vector<std::byte> dst(1000);
    auto t = reader->read(desc, dst, std::chrono::seconds(5));
    REQUIRE(settle(*t));
    CHECK(!t->ok());
    CHECK(t->error().find("checksum mismatch") != std::string::npos);
    CHECK(t->code() == runtime::errc::corrupt);
  }
}

TEST_CASE("fabric transport: bad provider, foreign address, wrong size and a gone owner are clear errors") {
  auto none = fabric_transport::create({"no-such-provider", ""});
  REQUIRE(!none);
  CHECK(none.error().find("libfabric provider 'no-such-provider'") != std::string::npos);
  CHECK(none.error().find("fi_getinfo") != std::string::npos);

  for (const auto& cfg : providers) {
    CAPTURE(cfg.provider);
    auto reader = make(cfg);
    auto bytes = random_bytes(64 << 10, 9);
    std::vector<std::byte> dst(bytes.size());
    runtime::remote_memory foreign{{1, 2, 3}, 0, 1, bytes.size(), 0};
    auto t = reader->read(foreign, dst, std::chrono::seconds(2));
    REQUIRE(t->done());
    CHECK(t->error().find("owner address is 3 bytes") != std::string::npos);
    CHECK(t->code() == runtime::errc::unavailable);

    auto owner = make(cfg);
    auto reg = owner->register_memory(bytes);
    REQUIRE(reg);
    std::vector<std::byte> small(10);
    auto w = reader->read((*reg)->describe(0, bytes.size()), small, std::chrono::seconds(2));
    REQUIRE(w->done());
    CHECK(w->error().find("destination is 10 bytes") != std::string::npos);
    CHECK(w->code() == runtime::errc::invalid_argument);
    CHECK(!owner->register_memory({}));

    // The owner goes away: the read ends with an error within its timeout, never hangs.
    auto desc = (*reg)->describe(0, bytes.size());
    reg->reset();
    owner.reset();
    auto gone = reader->read(desc, dst, std::chrono::milliseconds(500));
    REQUIRE(settle(*gone));
    CHECK(!gone->ok());
    // No answer in time, no way to the owner, or its side rejected the key: never data.
    const auto c = gone->code();
    CHECK((c == runtime::errc::timed_out || c == runtime::errc::unavailable || c == runtime::errc::refused));
    MESSAGE(cfg.provider << " read of a gone owner (" << runtime::to_string(c) << "): " << gone->error());
  }
}

// Another process that registers `n` random bytes (seed 11) and sends their descriptor; it
// exits when told to (finish()), after closing its endpoint.
struct forked_owner {
  int to_parent[2] = {-1, -1}, to_child[2] = {-1, -1};
  pid_t pid = -1;
  runtime::remote_memory desc;

  forked_owner(const fabric_config& cfg, size_t n) {
    REQUIRE(::pipe(to_parent) == 0);
    REQUIRE(::pipe(to_child) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the owner: registers, sends its descriptor, waits for the word to go
      auto t = fabric_transport::create(cfg);
      if (!t) ::_exit(2);
      auto bytes = random_bytes(n, 11);
      auto reg = (*t)->register_memory(bytes);
      if (!reg) ::_exit(3);
      auto d = (*reg)->describe(0, n);
      uint64_t head[5] = {d.owner.size(), d.addr, d.key, d.length, d.crc32c};
      if (::write(to_parent[1], head, sizeof head) != sizeof head) ::_exit(4);
      if (::write(to_parent[1], d.owner.data(), d.owner.size()) != static_cast<ssize_t>(d.owner.size())) ::_exit(4);
      char go;
      [[maybe_unused]] auto r = ::read(to_child[0], &go, 1);  // the parent has read
      reg->reset();
      t->reset();  // closes the endpoint (and removes its shm region) before _exit
      ::_exit(0);
    }
    uint64_t head[5];
    REQUIRE(::read(to_parent[0], head, sizeof head) == sizeof head);
    desc.owner.resize(head[0]);
    REQUIRE(::read(to_parent[0], desc.owner.data(), desc.owner.size()) == static_cast<ssize_t>(desc.owner.size()));
    desc.addr = head[1];
    desc.key = head[2];
    desc.length = head[3];
    desc.crc32c = static_cast<uint32_t>(head[4]);
  }

  // Tells the owner to go; true when it exited cleanly.
  bool finish() {
    char go = 1;
    CHECK(::write(to_child[1], &go, 1) == 1);
    int status = 0;
    ::waitpid(std::exchange(pid, -1), &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

  ~forked_owner() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]})
      if (fd >= 0) ::close(fd);
  }
};

TEST_CASE("fabric transport: a read from another process's registered memory is bit-exact") {
  for (const auto& cfg : providers) {
    CAPTURE(cfg.provider);
    const size_t n = (2 << 20) + 77;
    forked_owner owner(cfg, n);
    auto reader = make(cfg);
    std::vector<std::byte> dst(n);
    auto t = reader->read(owner.desc, dst, std::chrono::seconds(5));
    bool settled = settle(*t);
    CHECK(owner.finish());
    REQUIRE(settled);
    CHECK_MESSAGE(t->ok(), t->error());
    CHECK(dst == random_bytes(n, 11));
  }
}

TEST_CASE("fabric transport: read_all coalesces ranges adjacent on both sides, each part still checked") {
  for (const auto& cfg : providers) {
    CAPTURE(cfg.provider);
    // The owner's bytes outlive both endpoints: the owner's progress thread may still be
    // sending a response when the reader's completion has come (tcp;ofi_rxm), and a buffer
    // freed before the endpoint is closed is read after free.
    constexpr size_t block = 6144, n = 8;
    auto bytes = random_bytes(block * n, 11);
    auto owner = make(cfg);
    auto reader = make(cfg);
    auto reg = owner->register_memory(bytes);
    REQUIRE(reg);
    std::vector<std::byte> dst(block * n);
    auto run = [&](const std::vector<size_t>& src_blocks, const std::vector<size_t>& dst_blocks) {
      std::vector<runtime::remote_memory> srcs;
      std::vector<std::span<std::byte>> dsts;
      for (size_t i = 0; i < src_blocks.size(); ++i) {
        srcs.push_back((*reg)->describe(src_blocks[i] * block, block));
        dsts.emplace_back(dst.data() + dst_blocks[i] * block, block);
      }
      std::fill(dst.begin(), dst.end(), std::byte{0});
      auto ts = reader->read_all(srcs, dsts, std::chrono::seconds(5));
      bool ok = true;
      for (auto& t : ts) {
        REQUIRE(settle(*t));
        ok = ok && t->ok();
      }
      for (size_t i = 0; ok && i < src_blocks.size(); ++i)
        CHECK(std::memcmp(dst.data() + dst_blocks[i] * block, bytes.data() + src_blocks[i] * block, block) == 0);
      return std::pair{ts.size(), ok};
    };
    CHECK(run({0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}) == std::pair<size_t, bool>{1, true});
    CHECK(run({7, 6, 5, 4}, {3, 2, 1, 0}) == std::pair<size_t, bool>{1, true});     // both descending
    CHECK(run({0, 1, 2, 5, 6}, {4, 5, 6, 0, 1}) == std::pair<size_t, bool>{2, true});  // two runs
    CHECK(run({0, 1, 2}, {2, 1, 0}) == std::pair<size_t, bool>{3, true});           // opposite directions: one each
    // A part changed after it was described fails its (coalesced) read.
    std::vector<runtime::remote_memory> srcs;
    std::vector<std::span<std::byte>> dsts;
    for (size_t i = 0; i < 4; ++i) {
      srcs.push_back((*reg)->describe(i * block, block));
      dsts.emplace_back(dst.data() + i * block, block);
    }
    bytes[2 * block + 17] ^= std::byte{1};
    auto ts = reader->read_all(srcs, dsts, std::chrono::seconds(5));
    REQUIRE(ts.size() == 1);
    REQUIRE(settle(*ts[0]));
    CHECK(!ts[0]->ok());
    CHECK(ts[0]->error().find("checksum mismatch") != std::string::npos);
    CHECK(ts[0]->code() == runtime::errc::corrupt);
  }
}

TEST_CASE("fabric transport: thousands of reads of an owner that is stopped for a while all complete bit-exact") {
  // More reads than a provider queue holds, to an owner process this endpoint has not read
  // before (rxm connects on the first read) and that makes no progress for 300 ms (SIGSTOP):
  // the reads the provider cannot take meanwhile wait in the transport's queue, they do not
  // fail, and read_all returns without waiting for the provider.
  for (const auto& cfg : providers) {
    CAPTURE(cfg.provider);
    constexpr size_t block = 1024, n = 4096;
    forked_owner owner(cfg, block * n);
    const auto bytes = random_bytes(block * n, 11);
    REQUIRE(::kill(owner.pid, SIGSTOP) == 0);
    auto reader = make(cfg);
    std::vector<std::byte> dst(block * n);
    std::vector<runtime::remote_memory> srcs;
    std::vector<std::span<std::byte>> dsts;
    for (size_t i = 0; i < n; ++i) {  // block i lands at n-1-i: no two reads coalesce
      runtime::remote_memory m = owner.desc;
      m.addr += i * block;
      m.length = block;
      m.crc32c = storage::crc32c(bytes.data() + i * block, block);
      srcs.push_back(m);
      dsts.emplace_back(dst.data() + (n - 1 - i) * block, block);
    }
    auto ts = reader->read_all(srcs, dsts, std::chrono::seconds(20));
    REQUIRE(ts.size() == n);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    REQUIRE(::kill(owner.pid, SIGCONT) == 0);
    size_t failed = 0;
    std::string first_error;
    for (auto& t : ts) {
      REQUIRE(settle(*t, std::chrono::seconds(30)));
      if (!t->ok() && failed++ == 0) first_error = t->error();
    }
    CHECK_MESSAGE(failed == 0, first_error);
    for (size_t i = 0; i < n; ++i)
      if (std::memcmp(dst.data() + (n - 1 - i) * block, bytes.data() + i * block, block) != 0) FAIL("block " << i << " differs");
    CHECK(owner.finish());
  }
}

TEST_CASE("fabric transport: reads of an owner stopped past their deadline fail at it, and nothing lands in their memory later") {
  // A stopped owner (SIGSTOP) keeps its connection open and answers nothing: a read posted to
  // tcp;ofi_rxm would wait for it forever (shm reads the owner's memory without it). Each read
  // ends by its deadline, with a timeout or bit-exact, and once it has ended the transport
  // writes nothing more into its destination, also when the owner resumes (the caller reuses
  // that memory at once: a recompute, another request).
  for (const auto& cfg : providers) {
    CAPTURE(cfg.provider);
    constexpr size_t block = 64 << 10, n = 16;
    forked_owner owner(cfg, block * n);
    auto reader = make(cfg);
    {  // connected and served once while the owner runs
      std::vector<std::byte> first(block);
      runtime::remote_memory m = owner.desc;
      m.length = block;
      m.crc32c = storage::crc32c(random_bytes(block * n, 11).data(), block);
      auto t = reader->read(m, first, std::chrono::seconds(5));
      REQUIRE(settle(*t));
      REQUIRE_MESSAGE(t->ok(), t->error());
    }
    REQUIRE(::kill(owner.pid, SIGSTOP) == 0);
    std::vector<std::byte> dst(block * n, std::byte{0x5a});
    std::vector<std::shared_ptr<runtime::transfer>> ts;
    const auto bytes = random_bytes(block * n, 11);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      runtime::remote_memory m = owner.desc;
      m.addr += i * block;
      m.length = block;
      m.crc32c = storage::crc32c(bytes.data() + i * block, block);
      ts.push_back(reader->read(m, std::span(dst).subspan(i * block, block), std::chrono::milliseconds(500)));
    }
    size_t timed_out = 0;
    for (size_t i = 0; i < n; ++i) {  // shm reads the owner's memory without its help: those succeed
      auto& t = ts[i];
      REQUIRE(settle(*t, std::chrono::seconds(5)));
      if (t->ok()) CHECK(std::memcmp(dst.data() + i * block, bytes.data() + i * block, block) == 0);
      else CHECK_MESSAGE(t->code() == runtime::errc::timed_out, t->error());
      timed_out += !t->ok();
    }
    const double ended_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(cfg.provider << ": " << timed_out << " of " << n << " reads of the stopped owner timed out; all ended after "
                         << ended_s << " s (deadline 0.5 s)");
    if (cfg.provider != "shm") CHECK(timed_out == n);
    CHECK(ended_s < 3);
    std::fill(dst.begin(), dst.end(), std::byte{0x5a});  // what the caller put there after the failure
    REQUIRE(::kill(owner.pid, SIGCONT) == 0);
    {  // a new read of the resumed owner succeeds: it travels behind the old ones on the same
       // connection, so once it is back the owner has answered those too
      std::vector<std::byte> again(block);
      runtime::remote_memory m = owner.desc;
      m.length = block;
      m.crc32c = storage::crc32c(bytes.data(), block);
      auto t = reader->read(m, again, std::chrono::seconds(5));
      REQUIRE(settle(*t));
      CHECK_MESSAGE(t->ok(), t->error());
    }
    CHECK_MESSAGE(std::all_of(dst.begin(), dst.end(), [](std::byte b) { return b == std::byte{0x5a}; }),
                  "bytes landed in a read's destination after the read had failed");
    CHECK(owner.finish());
  }
}

namespace {

// Runs `body` in a child process; its return value is the child's exit status.
int in_child(const std::function<int()>& body) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string region_name(long pid, long n) { return std::to_string(pid) + ":" + std::to_string(::getuid()) + ":" + std::to_string(n); }

}  // namespace

TEST_CASE("fabric transport: the shm sweep removes this user's regions of gone processes and of this pid, nothing else") {
  auto dir = std::filesystem::temp_directory_path() / ("shoal-shm-sweep-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  pid_t dead = ::fork();  // a pid, then reaped: gone
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string other_user = std::to_string(dead) + ":" + std::to_string(::getuid() + 1) + ":0";
  const std::vector<std::string> swept = {region_name(::getpid(), 0), region_name(dead, 3)};
  const std::vector<std::string> kept = {region_name(1, 0), region_name(::getppid(), 2), other_user, "notes.txt",
                                         std::to_string(dead) + ":" + std::to_string(::getuid()), "+5:0:0"};
  for (const auto& n : swept) std::ofstream(dir / n) << "x";
  for (const auto& n : kept) std::ofstream(dir / n) << "x";
  CHECK(transport::sweep_stale_shm_regions(dir.string()) == swept.size());
  for (const auto& n : swept) CHECK_MESSAGE(!std::filesystem::exists(dir / n), n);
  for (const auto& n : kept) CHECK_MESSAGE(std::filesystem::exists(dir / n), n);
  CHECK(transport::sweep_stale_shm_regions((dir / "absent").string()) == 0);
  std::filesystem::remove_all(dir);
}

// A process that dies without closing its endpoint leaves its shm region behind; a later
// process that gets the same pid found the region's recorded owner (its own pid) alive, and
// the provider refused its endpoint with EBUSY. The region of a dead owner is copied under a
// child's own name with the child's pid recorded (libfabric 1.17 keeps it at byte 4 of the
// region), which is that case without waiting for the pid to come round.
TEST_CASE("fabric transport: an shm endpoint comes up over a region left by an earlier process with the same pid") {
  int leaked_pid = -1;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  CHECK(in_child([&] {
          auto t = fabric_transport::create({"shm", ""});
          int me = ::getpid();
          if (!t || ::write(fds[1], &me, sizeof me) != sizeof me) return 1;
          ::_exit(0);  // no destructor: the region stays, as after a crash
        }) == 0);
  REQUIRE(::read(fds[0], &leaked_pid, sizeof leaked_pid) == sizeof leaked_pid);
  ::close(fds[0]);
  ::close(fds[1]);
  const auto leaked = std::filesystem::path("/dev/shm") / region_name(leaked_pid, 0);
  REQUIRE_MESSAGE(std::filesystem::exists(leaked), leaked.string());
  CHECK(in_child([&] {
          int me = ::getpid();
          const auto mine = std::filesystem::path("/dev/shm") / region_name(me, 0);
          std::error_code ec;
          if (!std::filesystem::copy_file(leaked, mine, ec)) return 2;
          {
            std::fstream f(mine, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(4);
            f.write(reinterpret_cast<const char*>(&me), sizeof me);
          }
          auto t = fabric_transport::create({"shm", ""});
          if (!t) std::fprintf(stderr, "%s\n", t.error().c_str());
          return t ? 0 : 3;
        }) == 0);
  CHECK_MESSAGE(!std::filesystem::exists(leaked), "the dead owner's region is swept: " << leaked.string());
}
