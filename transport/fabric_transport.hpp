// runtime::transport over a libfabric RDM endpoint: memory is registered with the domain and
// read by peers with one-sided RMA (fi_read), so the owner's CPU copies nothing. One endpoint
// per transport, one completion queue polled by the transport's progress thread (providers
// like tcp;ofi_rxm progress manually: the owner's side must poll too for reads of its memory
// to complete). A read never waits on its caller's thread: a piece the provider does not take
// at once (rxm still connecting to a new peer, a full queue) is queued and posted by the
// progress thread, or ended at its read's deadline. Bring-up errors name the provider and the
// step that failed.
#pragma once

#include <chrono>
#include <expected>
#include <memory>
#include <string>

#include "runtime/base/transport.hpp"

namespace shoal::transport {

struct fabric_config {
  std::string provider = "shm";  // "shm", "tcp;ofi_rxm", "verbs;ofi_rxm", "efa", ...
  // Local address to bind (tcp: the interface's IP, "127.0.0.1" for loopback); "" = the
  // provider's default.
  std::string node;
};

class fabric_transport final : public runtime::transport {
 public:
  static std::expected<std::unique_ptr<fabric_transport>, std::string> create(const fabric_config& cfg);
  // Stops the progress thread, then closes the endpoint (in-flight reads end with it).
  ~fabric_transport() override;

  std::string name() const override;
  std::vector<uint8_t> address() const override;
  std::expected<std::unique_ptr<runtime::registered_memory>, std::string> register_memory(
      std::span<const std::byte> bytes) override;
  std::shared_ptr<runtime::transfer> read(const runtime::remote_memory& src, std::span<std::byte> dst,
                                          std::chrono::milliseconds timeout) override;
  // Coalesces runs of ranges adjacent on both sides (ascending or descending, same owner and
  // key, equal lengths) into one read each, split at the provider's message size.
  std::vector<std::shared_ptr<runtime::transfer>> read_all(std::span<const runtime::remote_memory> srcs,
                                                           std::span<const std::span<std::byte>> dsts,
                                                           std::chrono::milliseconds timeout) override;

  struct state;

 private:
  // One read of `length` bytes at `addr` (owner, key from `src`) into `dst`, whose parts
  // (offset, length, crc32c) are each verified on arrival.
  struct part {
    size_t offset = 0, length = 0;
    uint32_t crc = 0;
  };
  std::shared_ptr<runtime::transfer> post(const runtime::remote_memory& src, uint64_t addr, std::span<std::byte> dst,
                                          std::vector<part> parts, std::chrono::milliseconds timeout);
  explicit fabric_transport(std::shared_ptr<state> s);
  std::shared_ptr<state> s_;
};

// Where [offset, offset + length) of `r` (a registration of a fabric_transport) lies for
// peers, without the checksum (crc32c left 0): for a caller describing the same bytes
// through several endpoints, which checksums them once.
runtime::remote_memory locate(const runtime::registered_memory& r, uint64_t offset, uint64_t length);

// Removes the shm regions in `dir` (libfabric's shm provider names them "<pid>:<uid>:<n>")
// that belong to this user and were left by a process that is gone (killed, or exited without
// closing its endpoint), or that carry this process's own pid: a region left by an earlier
// process whose pid this one now has makes the provider refuse this process's endpoint
// (fi_enable: EBUSY, since the owner it records, this pid, is alive). Called once a process
// before its first shm endpoint, with "/dev/shm"; returns how many it removed. Like the
// provider, it takes a pid not alive in this pid namespace as gone.
size_t sweep_stale_shm_regions(const std::string& dir);

// The bench's reference: the same reads as raw fi_read calls on a fresh endpoint of the same
// provider, `inflight` at a time, no checksum and no bookkeeping; the wall time of the loop.
// Ranges larger than the provider's message size are not split (the caller keeps them small).
std::expected<double, std::string> raw_read_seconds(const fabric_config& cfg, std::span<const runtime::remote_memory> ranges,
                                                    std::span<std::byte> dst, size_t inflight);

}  // namespace shoal::transport
