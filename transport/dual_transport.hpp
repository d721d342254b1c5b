// Shared memory within a host, a network provider across hosts, behind one runtime::transport
// (engine.transport = "auto", or "shm+<provider>"). Memory is registered with both endpoints;
// a description carries the host's identity and both endpoints' address and key (in
// remote_memory::owner), its addr and key are the network endpoint's, and its crc32c is
// computed once. A reader on the same host reads through shm, any other through the network
// provider; a description of a single-provider transport is read through the network
// provider. Every node of a cluster names the same engine.transport.
#pragma once

#include <atomic>
#include <expected>
#include <memory>
#include <string>

#include "transport/fabric_transport.hpp"

namespace shoal::transport {

class dual_transport final : public runtime::transport {
 public:
  // `host`: this host's identity ("" = the machine's: its hostname and boot id; tests give
  // others to stand for other hosts).
  static std::expected<std::unique_ptr<dual_transport>, std::string> create(const fabric_config& remote,
                                                                            std::string host = {});
  std::string name() const override;
  std::vector<uint8_t> address() const override;
  std::expected<std::unique_ptr<runtime::registered_memory>, std::string> register_memory(
      std::span<const std::byte> bytes) override;
  std::shared_ptr<runtime::transfer> read(const runtime::remote_memory& src, std::span<std::byte> dst,
                                          std::chrono::milliseconds timeout) override;
  std::vector<std::shared_ptr<runtime::transfer>> read_all(std::span<const runtime::remote_memory> srcs,
                                                           std::span<const std::span<std::byte>> dsts,
                                                           std::chrono::milliseconds timeout) override;
  // Ranges read through shm / through the network provider since creation.
  uint64_t reads_local() const { return local_reads_; }
  uint64_t reads_remote() const { return remote_reads_; }

 private:
  dual_transport(std::unique_ptr<fabric_transport> local, std::unique_ptr<fabric_transport> remote, std::string host);
  // The range to read and the endpoint to read it with; an error naming a bad description.
  std::expected<std::pair<runtime::remote_memory, fabric_transport*>, std::string> route(
      const runtime::remote_memory& src);
  std::unique_ptr<fabric_transport> local_, remote_;
  std::string host_;
  std::atomic<uint64_t> local_reads_{0}, remote_reads_{0};
};

// The bulk transport engine.transport names: "auto" (shm within the host, tcp;ofi_rxm
// across), "shm+<provider>", or one libfabric provider ("shm", "tcp;ofi_rxm", ...). `node`:
// the address network providers bind to.
std::expected<std::unique_ptr<runtime::transport>, std::string> open_transport(const std::string& spec,
                                                                               const std::string& node);

}  // namespace shoal::transport
