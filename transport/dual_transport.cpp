#include "transport/dual_transport.hpp"

#include <cstring>
#include <fstream>

#include <unistd.h>

#include "storage/crc32c.hpp"

namespace shoal::transport {

namespace {

constexpr char magic[] = "shoal-dual1";  // with its NUL: no libfabric address starts so
constexpr size_t magic_size = sizeof magic;

// The owner bytes of a dual description: magic, host, shm address, the shm registration's
// base and key, the network registration's base, network address.
struct owner_fields {
  std::string host;
  std::vector<uint8_t> local_owner, remote_owner;
  uint64_t local_base = 0, local_key = 0, remote_base = 0;
};

void put(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  put(out, n);
  auto b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

std::vector<uint8_t> encode(const owner_fields& f) {
  std::vector<uint8_t> out(magic, magic + magic_size);
  put_bytes(out, f.host.data(), f.host.size());
  put_bytes(out, f.local_owner.data(), f.local_owner.size());
  put(out, f.local_base);
  put(out, f.local_key);
  put(out, f.remote_base);
  put_bytes(out, f.remote_owner.data(), f.remote_owner.size());
  return out;
}

bool is_dual(const std::vector<uint8_t>& owner) {
  return owner.size() >= magic_size && std::memcmp(owner.data(), magic, magic_size) == 0;
}

std::expected<owner_fields, std::string> decode(const std::vector<uint8_t>& owner) {
  size_t at = magic_size;
  auto get = [&](uint64_t& v) {
    if (owner.size() - at < 8) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(owner[at + i]) << (8 * i);
    at += 8;
    return true;
  };
  auto get_bytes = [&](auto& into) {
    uint64_t n = 0;
    if (!get(n) || n > 4096 || owner.size() - at < n) return false;
    into.assign(owner.begin() + static_cast<std::ptrdiff_t>(at), owner.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
    return true;
  };
  owner_fields f;
  if (!get_bytes(f.host) || !get_bytes(f.local_owner) || !get(f.local_base) || !get(f.local_key) ||
      !get(f.remote_base) || !get_bytes(f.remote_owner) || at != owner.size())
    return std::unexpected("a shm+network description whose owner field (" + std::to_string(owner.size()) +
                           " bytes) is truncated or malformed");
  return f;
}

// This machine: hostname and kernel boot id (containers sharing a kernel but not a hostname
// count as other hosts: shm between them may be fenced off).
std::string this_host() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(name) + "/" + boot;
}

// One registration with both endpoints.
class dual_registration final : public runtime::registered_memory {
 public:
  dual_registration(std::unique_ptr<runtime::registered_memory> local, std::unique_ptr<runtime::registered_memory> remote,
                    std::span<const std::byte> bytes, const std::string& host)
      : local_(std::move(local)), remote_(std::move(remote)), bytes_(bytes), host_(host) {}

  runtime::remote_memory describe(uint64_t offset, uint64_t length) const override {
    const runtime::remote_memory l = locate(*local_, 0, bytes_.size()), r = locate(*remote_, offset, length);
    owner_fields f{host_, l.owner, r.owner, l.addr, l.key, r.addr - std::min<uint64_t>(offset, bytes_.size())};
    runtime::remote_memory m = r;
    m.owner = encode(f);
    m.crc32c = storage::crc32c(bytes_.data() + std::min<uint64_t>(offset, bytes_.size()), m.length);
    return m;
  }

 private:
  std::unique_ptr<runtime::registered_memory> local_, remote_;
  std::span<const std::byte> bytes_;
  std::string host_;
};

}  // namespace

std::expected<std::unique_ptr<dual_transport>, std::string> dual_transport::create(const fabric_config& remote,
                                                                                   std::string host) {
  auto local = fabric_transport::create({"shm", ""});
  if (!local) return std::unexpected("shm within the host: " + local.error());
  auto net = fabric_transport::create(remote);
  if (!net) return std::unexpected(remote.provider + " across hosts: " + net.error());
  if (host.empty()) host = this_host();
  return std::unique_ptr<dual_transport>(new dual_transport(std::move(*local), std::move(*net), std::move(host)));
}

dual_transport::dual_transport(std::unique_ptr<fabric_transport> local, std::unique_ptr<fabric_transport> remote,
                               std::string host)
    : local_(std::move(local)), remote_(std::move(remote)), host_(std::move(host)) {}

std::string dual_transport::name() const {
  return local_->name() + " within the host, " + remote_->name() + " across hosts";
}

std::vector<uint8_t> dual_transport::address() const {
  return encode({host_, local_->address(), remote_->address(), 0, 0, 0});
}

std::expected<std::unique_ptr<runtime::registered_memory>, std::string> dual_transport::register_memory(
    std::span<const std::byte> bytes) {
  auto l = local_->register_memory(bytes);
  if (!l) return std::unexpected(l.error());
  auto r = remote_->register_memory(bytes);
  if (!r) return std::unexpected(r.error());
  return std::make_unique<dual_registration>(std::move(*l), std::move(*r), bytes, host_);
}

std::expected<std::pair<runtime::remote_memory, fabric_transport*>, std::string> dual_transport::route(
    const runtime::remote_memory& src) {
  if (!is_dual(src.owner)) return std::pair{src, remote_.get()};  // a single-provider peer
  auto f = decode(src.owner);
  if (!f) return std::unexpected(f.error());
  runtime::remote_memory m = src;
  if (f->host == host_) {
    m.owner = std::move(f->local_owner);
    m.addr = f->local_base + (src.addr - f->remote_base);
    m.key = f->local_key;
    return std::pair{std::move(m), local_.get()};
  }
  m.owner = std::move(f->remote_owner);
  return std::pair{std::move(m), remote_.get()};
}

std::shared_ptr<runtime::transfer> dual_transport::read(const runtime::remote_memory& src, std::span<std::byte> dst,
                                                        std::chrono::milliseconds timeout) {
  auto routed = route(src);
  if (!routed) {
    auto t = std::make_shared<runtime::transfer>();
    t->fail(runtime::errc::unavailable, name() + ": " + routed.error());
    return t;
  }
  ++(routed->second == local_.get() ? local_reads_ : remote_reads_);
  return routed->second->read(routed->first, dst, timeout);
}

std::vector<std::shared_ptr<runtime::transfer>> dual_transport::read_all(std::span<const runtime::remote_memory> srcs,
                                                                         std::span<const std::span<std::byte>> dsts,
                                                                         std::chrono::milliseconds timeout) {
  // Runs of ranges going to one endpoint keep their order, so each endpoint still coalesces
  // what is adjacent.
  std::vector<std::shared_ptr<runtime::transfer>> out;
  std::vector<runtime::remote_memory> run;
  std::vector<std::span<std::byte>> run_dst;
  fabric_transport* via = nullptr;
  auto flush = [&] {
    if (run.empty()) return;
    for (auto& t : via->read_all(run, run_dst, timeout)) out.push_back(std::move(t));
    run.clear();
    run_dst.clear();
  };
  for (size_t i = 0; i < srcs.size() && i < dsts.size(); ++i) {
    auto routed = route(srcs[i]);
    if (!routed) {
      flush();
      out.push_back(read(srcs[i], dsts[i], timeout));  // ends with the error
      continue;
    }
    if (routed->second != via) flush();
    via = routed->second;
    ++(via == local_.get() ? local_reads_ : remote_reads_);
    run.push_back(std::move(routed->first));
    run_dst.push_back(dsts[i]);
  }
  flush();
  return out;
}

std::expected<std::unique_ptr<runtime::transport>, std::string> open_transport(const std::string& spec,
                                                                               const std::string& node) {
  std::string network;
  if (spec == "auto") network = "tcp;ofi_rxm";
  else if (spec.starts_with("shm+")) network = spec.substr(4);
  if (!network.empty()) {
    auto t = dual_transport::create({network, node});
    if (!t) return std::unexpected(t.error());
    return std::unique_ptr<runtime::transport>(std::move(*t));
  }
  auto t = fabric_transport::create({spec, spec == "shm" ? "" : node});
  if (!t) return std::unexpected(t.error());
  return std::unique_ptr<runtime::transport>(std::move(*t));
}

}  // namespace shoal::transport
