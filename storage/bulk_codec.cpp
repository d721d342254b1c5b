// The bulk data path's frames (see bulk.hpp): the 4-byte length, then one msgpack array
// (runtime/base/msgpack_frame, the codec the expert-parallel frames use too); requests and
// replies encoded and parsed, every field of a received one checked.
#include "storage/bulk.hpp"
#include "storage/bulk_wire.hpp"

#include <cerrno>
#include <cstring>

#include <sys/socket.h>
#include <sys/uio.h>

#include "runtime/base/msgpack_frame.hpp"

namespace shoal::storage {

namespace {

constexpr std::string_view frame_magic = "shoal-kv";
constexpr uint64_t frame_version = 1;
constexpr uint32_t request_fields = 9, reply_fields = 4;

void put_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

}  // namespace

std::string errno_text(int e) { return std::strerror(e); }

uint32_t get_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Writes the 4-byte length, `head`, then `tail` (the bin body) from one gathered iovec, no
// copy; false on any error (errno set).
bool send_frame(int fd, std::span<const uint8_t> head, std::span<const uint8_t> tail) {
  uint8_t len[4];
  put_be32(len, static_cast<uint32_t>(head.size() + tail.size()));
  iovec iov[3] = {{len, 4}, {const_cast<uint8_t*>(head.data()), head.size()},
                  {const_cast<uint8_t*>(tail.data()), tail.size()}};
  int first = 0;
  while (first < 3) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = static_cast<size_t>(3 - first);
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);  // a peer gone is an error here, not a SIGPIPE
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    auto left = static_cast<size_t>(w);
    while (first < 3 && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < 3) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return true;
}

std::vector<uint8_t> encode_reply_head(const bulk_reply& r, size_t payload_bytes) {
  runtime::frame_sink s;
  runtime::frame_packer pk(s);
  pk.pack_array(reply_fields);
  pk.pack(r.id);
  pk.pack(static_cast<uint64_t>(r.status));
  pk.pack(r.message);
  pk.pack_bin(static_cast<uint32_t>(payload_bytes));
  return std::move(s.bytes);
}

std::vector<uint8_t> encode_request_head(const bulk_request& r) {
  runtime::frame_sink s;
  runtime::frame_packer pk(s);
  pk.pack_array(request_fields);
  pk.pack(frame_magic);
  pk.pack(frame_version);
  pk.pack(std::string_view(r.op == bulk_op::put ? "put" : "get"));
  pk.pack(r.id);
  pk.pack(r.key.block.hi);
  pk.pack(r.key.block.lo);
  pk.pack(static_cast<uint64_t>(r.key.index));
  pk.pack(static_cast<uint64_t>(r.traffic_class));
  pk.pack_bin(static_cast<uint32_t>(r.payload.size()));
  return std::move(s.bytes);
}

std::vector<uint8_t> encode_reply(const bulk_reply& r) {
  auto out = encode_reply_head(r, r.payload.size());
  out.insert(out.end(), r.payload.begin(), r.payload.end());
  return out;
}

std::expected<parsed_request, std::string> parse_request(std::span<const uint8_t> body) {
  runtime::frame_fields f(body, request_fields, "request");
  auto magic = f.str(0, "magic");
  if (magic && *magic != frame_magic) f.fail("magic is not \"shoal-kv\"");
  auto version = f.uint(1, "version");
  if (version && *version != frame_version)
    f.fail("version " + std::to_string(*version) + " is not " + std::to_string(frame_version));
  auto op = f.str(2, "op");
  if (op && *op != "put" && *op != "get") f.fail("op \"" + std::string(*op) + "\" is not put or get");
  auto id = f.uint(3, "id");
  auto hi = f.uint(4, "key_hi");
  auto lo = f.uint(5, "key_lo");
  auto index = f.uint(6, "index");
  if (index && *index > 254) f.fail("chunk index " + std::to_string(*index) + " out of range [0, 254]");
  auto cls = f.uint(7, "traffic_class");
  if (cls && (*cls > 255 || !traffic_class_from_byte(static_cast<uint8_t>(*cls))))
    f.fail("traffic class " + std::to_string(*cls) + " is unknown");
  auto payload = f.bin(8, "payload");
  if (!f.ok()) return std::unexpected(f.error());
  bulk_op o = *op == "put" ? bulk_op::put : bulk_op::get;
  if (o == bulk_op::put && payload->empty()) return std::unexpected("request put carries an empty chunk");
  if (o == bulk_op::get && !payload->empty()) return std::unexpected("request get carries a payload");
  return parsed_request{o, *id, {runtime::block_key{.lo = *lo, .hi = *hi}, static_cast<uint8_t>(*index)}, static_cast<uint8_t>(*cls), *payload};
}

std::expected<bulk_reply, std::string> parse_reply(std::span<const uint8_t> body) {
  runtime::frame_fields f(body, reply_fields, "reply");
  auto id = f.uint(0, "id");
  auto status = f.uint(1, "status");
  auto message = f.str(2, "message");
  auto payload = f.bin(3, "payload");
  if (!f.ok()) return std::unexpected(f.error());
  if (*status > UINT32_MAX) return std::unexpected("reply status " + std::to_string(*status) + " out of range");
  return bulk_reply{*id, static_cast<uint32_t>(*status), std::string(*message), {payload->begin(), payload->end()}};
}

}  // namespace shoal::storage
