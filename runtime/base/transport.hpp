// Bulk bytes between processes (KV blocks and SWA slots of a prefill → decode handoff, SWA
// slot fetches): the owner registers memory and describes ranges of it (remote_memory: plain
// data that travels inside a CAF control message), the reader reads a range into a buffer of
// its own. Reads are one-sided (the owner's CPU does not copy), asynchronous (a transfer is
// polled, never awaited on a step loop) and checked: every range carries the crc32c of its
// bytes, verified on arrival, so a late or torn read is an error, never data. No libfabric
// type appears here; transport/ holds the backends.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/base/error.hpp"
#include "runtime/base/one_shot.hpp"

namespace shoal::runtime {

// A range of registered memory in another process.
struct remote_memory {
  std::vector<uint8_t> owner;  // the owner's transport address (backend-specific bytes)
  uint64_t addr = 0;           // where the range starts, in the owner's addressing
  uint64_t key = 0;            // the registration's remote key
  uint64_t length = 0;         // bytes
  uint32_t crc32c = 0;         // of the bytes when described
  bool operator==(const remote_memory&) const = default;
};

// One read in flight: filled by the backend's progress thread, polled by the reader.
class transfer : public one_shot<bool> {
 public:
  bool ok() const { return done() && error().empty(); }
  // Once done() and not ok(), what a reader may branch on: timed_out (no answer in time: the
  // owner may be gone or slow), corrupt (bytes that fail their checksum: the owner's memory
  // changed), refused (the owner's side rejected the key or range), unavailable (no way to
  // the owner: gone, unreachable, transport closed), invalid_argument (the read cannot be
  // done as asked). error() says it for people.
  errc code() const { return code_; }
  // The backend, exactly once: complete() or fail().
  void complete() { set(true, {}); }
  void fail(errc code, std::string why) {
    code_ = code;  // published by set()
    set(false, std::move(why));
  }

 private:
  errc code_ = errc::unavailable;
};

// A registration: memory the owner keeps alive (and unchanged while described ranges may be
// read) until this object is destroyed.
class registered_memory {
 public:
  virtual ~registered_memory() = default;
  // The range [offset, offset + length) of the registration, with the crc32c of its bytes now.
  virtual remote_memory describe(uint64_t offset, uint64_t length) const = 0;
};

class transport {
 public:
  virtual ~transport() = default;
  // "libfabric shm", "libfabric tcp;ofi_rxm", ...
  virtual std::string name() const = 0;
  // What a remote_memory's `owner` is for memory registered here.
  virtual std::vector<uint8_t> address() const = 0;
  virtual std::expected<std::unique_ptr<registered_memory>, std::string> register_memory(
      std::span<const std::byte> bytes) = 0;
  // Starts reading `src` into `dst` (dst.size() must equal src.length); the transfer fails
  // with a message naming the problem on a bad address or key, an unreachable owner, a
  // checksum mismatch, or when `timeout` passes first. `dst` must stay valid until done().
  virtual std::shared_ptr<transfer> read(const remote_memory& src, std::span<std::byte> dst,
                                         std::chrono::milliseconds timeout) = 0;
  // Reads srcs[i] into dsts[i], each as read() would. A backend may move ranges that are
  // adjacent both in the owner's memory and here (in the same order) as one read, each part
  // still checked against its own crc32c; the transfers returned (one per read issued) all
  // end, and all are ok exactly when every range arrived intact.
  virtual std::vector<std::shared_ptr<transfer>> read_all(std::span<const remote_memory> srcs,
                                                          std::span<const std::span<std::byte>> dsts,
                                                          std::chrono::milliseconds timeout) {
    std::vector<std::shared_ptr<transfer>> out;
    for (size_t i = 0; i < srcs.size() && i < dsts.size(); ++i) out.push_back(read(srcs[i], dsts[i], timeout));
    return out;
  }
};

}  // namespace shoal::runtime
