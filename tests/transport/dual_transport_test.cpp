// dual_transport ("auto": shm within a host, tcp;ofi_rxm across): a reader on the owner's
// host reads through shm, a reader on another host (another host identity here) through tcp,
// both bit-exact and checksum-checked; single-provider descriptions still read; a malformed
// description is an error naming it.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "transport/dual_transport.hpp"

using namespace shoal;
using transport::dual_transport;

namespace {

std::unique_ptr<dual_transport> make(const std::string& host) {
  auto t = dual_transport::create({"tcp;ofi_rxm", "127.0.0.1"}, host);
  REQUIRE_MESSAGE(t, (t ? "" : t.error()));
  return std::move(*t);
}

void settle(const runtime::transfer& t) {
  for (int i = 0; i < 10'000 && !t.done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(t.done());
}

}  // namespace

TEST_CASE("dual transport: shm for a reader on the owner's host, the network provider for others") {
  std::vector<std::byte> bytes((1 << 20) + 77);
  std::mt19937 rng(3);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  auto owner = make("host-a");
  auto near = make("host-a");
  auto far = make("host-b");
  CHECK(owner->name() == "libfabric shm within the host, libfabric tcp;ofi_rxm across hosts");
  auto reg = owner->register_memory(bytes);
  REQUIRE_MESSAGE(reg, (reg ? "" : reg.error()));
  for (dual_transport* reader : {near.get(), far.get()}) {
    CAPTURE(reader == near.get());
    for (auto [off, len] : {std::pair<uint64_t, uint64_t>{0, bytes.size()}, {4096, 65536}, {bytes.size() - 9, 9}}) {
      std::vector<std::byte> dst(len);
      auto t = reader->read((*reg)->describe(off, len), dst, std::chrono::seconds(5));
      settle(*t);
      CHECK_MESSAGE(t->ok(), t->error());
      CHECK(std::memcmp(dst.data(), bytes.data() + off, len) == 0);
    }
    // Adjacent pieces in one call (each endpoint coalesces what is adjacent).
    std::vector<runtime::remote_memory> srcs;
    std::vector<std::byte> dst(8 * 4096);
    std::vector<std::span<std::byte>> dsts;
    for (size_t i = 0; i < 8; ++i) {
      srcs.push_back((*reg)->describe(8192 + i * 4096, 4096));
      dsts.push_back(std::span(dst).subspan(i * 4096, 4096));
    }
    for (auto& t : reader->read_all(srcs, dsts, std::chrono::seconds(5))) {
      settle(*t);
      CHECK_MESSAGE(t->ok(), t->error());
    }
    CHECK(std::memcmp(dst.data(), bytes.data() + 8192, dst.size()) == 0);
  }
  CHECK(near->reads_local() == 11);
  CHECK(near->reads_remote() == 0);
  CHECK(far->reads_local() == 0);
  CHECK(far->reads_remote() == 11);

  // Changed bytes fail the checksum on either path.
  auto desc = (*reg)->describe(0, 4096);
  bytes[100] ^= std::byte{1};
  for (dual_transport* reader : {near.get(), far.get()}) {
    std::vector<std::byte> dst(4096);
    auto t = reader->read(desc, dst, std::chrono::seconds(5));
    settle(*t);
    CHECK_FALSE(t->ok());
  }

  // A description from a single-provider tcp endpoint goes over tcp.
  auto plain = transport::fabric_transport::create({"tcp;ofi_rxm", "127.0.0.1"});
  REQUIRE(plain.has_value());
  auto plain_reg = (*plain)->register_memory(bytes);
  REQUIRE(plain_reg.has_value());
  std::vector<std::byte> dst(1000);
  auto t = near->read((*plain_reg)->describe(500, 1000), dst, std::chrono::seconds(5));
  settle(*t);
  CHECK_MESSAGE(t->ok(), t->error());
  CHECK(std::memcmp(dst.data(), bytes.data() + 500, 1000) == 0);
  CHECK(near->reads_remote() == 1);

  // A truncated dual description: an error naming it, nothing read.
  auto bad = (*reg)->describe(0, 64);
  bad.owner.resize(bad.owner.size() - 3);
  std::vector<std::byte> small(64);
  auto e = far->read(bad, small, std::chrono::seconds(5));
  REQUIRE(e->done());
  CHECK(e->error().find("truncated or malformed") != std::string::npos);

  // open_transport: the names engine.transport takes.
  auto a = transport::open_transport("auto", "127.0.0.1");
  REQUIRE_MESSAGE(a, (a ? "" : a.error()));
  CHECK((*a)->name() == "libfabric shm within the host, libfabric tcp;ofi_rxm across hosts");
  auto s = transport::open_transport("shm", "127.0.0.1");
  REQUIRE(s.has_value());
  CHECK((*s)->name() == "libfabric shm");
  auto nope = transport::open_transport("shm+no-such-provider", "127.0.0.1");
  REQUIRE_FALSE(nope.has_value());
  CHECK(nope.error().find("no-such-provider across hosts") != std::string::npos);
}
