// Crash safety with a real process kill: a forked child puts chunks in a loop (sync always) and
// reports each acknowledged put through a pipe; the parent SIGKILLs it at a seeded random moment,
// reopens the store and checks every chunk it finds is whole, has the content the child derived
// from (key, version), is at least as new as the last acknowledged put, and no temp file remains.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "storage/chunk_store.hpp"
#include "tests/storage/store_fixture.hpp"

using namespace shoal::storage;
using namespace shoal::storage::test;

namespace {

constexpr uint64_t n_keys = 48;

size_t length_of(uint64_t version) { return 1 + (version * 7919) % 3000; }

// Payload = 8-byte version, then bytes derived from (key, version).
std::vector<std::byte> versioned_payload(const chunk_key& k, uint64_t version) {
  const auto body = payload_of(k, version, length_of(version));
  std::vector<std::byte> out(8 + body.size());
  std::memcpy(out.data(), &version, 8);
  std::memcpy(out.data() + 8, body.data(), body.size());
  return out;
}

[[noreturn]] void child_main(const store_options& o, uint64_t first_version, int ack_fd) {
  auto r = chunk_store::open(o);
  if (!r) ::_exit(2);
  for (uint64_t i = 0; i < 1'000'000; ++i) {  // bounded; the parent kills it long before
    const uint64_t version = first_version + i;
    const auto k = key_of(version % n_keys);
    if (!(*r)->put(k, versioned_payload(k, version), traffic_class::agent)) ::_exit(3);
    const uint64_t ack[2] = {version % n_keys, version};
    if (::write(ack_fd, ack, sizeof ack) != sizeof ack) ::_exit(4);
  }
  ::_exit(0);
}

}  // namespace

TEST_CASE("sigkill during puts never leaves a torn or temp chunk") {
  const uint32_t seed = 20240611;
  std::printf("SEED=%u\n", seed);
  std::mt19937 rng(seed);
  temp_dir d;
  fake_clock c;
  store_options o = options_for(d, c, 64ull << 20);
  o.sync = sync_policy::always;
  std::map<uint64_t, uint64_t> acked;  // key id → newest acknowledged version
  uint64_t total_acks = 0, temps_removed = 0;
  for (int iter = 0; iter < 12; ++iter) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      child_main(o, uint64_t(iter) * 1'000'000, fds[1]);
    }
    ::close(fds[1]);
    ::usleep(useconds_t(std::uniform_int_distribution<int>(10'000, 250'000)(rng)));
    REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));  // not an early error exit
    uint64_t ack[2];
    while (::read(fds[0], ack, sizeof ack) == sizeof ack) {
      acked[ack[0]] = ack[1];
      ++total_acks;
    }
    ::close(fds[0]);

    auto s = open_ok(o);
    CAPTURE(iter);
    CHECK(s->stats().corrupt_removed == 0);
    temps_removed += s->stats().temp_removed;
    CHECK(count_files(d.path, ".tmp-") == 0);
    for (uint64_t id = 0; id < n_keys; ++id) {
      const auto k = key_of(id);
      const auto g = s->get(k);
      if (!g) {
        CHECK(g.error().code == store_errc::not_found);
        CHECK_FALSE(acked.contains(id));  // an acknowledged put is never lost
        continue;
      }
      REQUIRE(g->size() >= 9);
      uint64_t version = 0;
      std::memcpy(&version, g->data(), 8);
      CHECK(version % n_keys == id);
      CHECK(*g == versioned_payload(k, version));
      if (acked.contains(id)) CHECK(version >= acked[id]);
    }
    s->check_invariants();
  }
  MESSAGE("acknowledged puts across kills: " << total_acks << ", temp files removed at reopen: "
                                              << temps_removed);
  CHECK(total_acks > 0);
}
