// libFuzzer target: a frame body of the storage nodes' bulk data path (storage/bulk), as a
// storage node parses requests and a kv client parses replies. The first byte picks which.
// A frame that parses encodes back to one that parses to the same fields (the put payload
// follows the request head on the wire, as bulk_exchange sends it); one that does not gets
// a message.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "storage/bulk.hpp"

namespace {

using namespace shoal::storage;

void check_request(std::span<const uint8_t> body) {
  auto r = parse_request(body);
  if (!r) {
    if (r.error().empty()) std::abort();
    return;
  }
  if (r->payload.size() > 0 && (r->payload.data() < body.data() || r->payload.data() + r->payload.size() > body.data() + body.size()))
    std::abort();
  bulk_request q;
  q.op = r->op, q.id = r->id, q.key = r->key, q.traffic_class = r->traffic_class, q.payload = r->payload;
  std::vector<uint8_t> again = encode_request_head(q);
  if (q.op == bulk_op::put) again.insert(again.end(), r->payload.begin(), r->payload.end());
  auto back = parse_request(again);
  if (!back || back->op != r->op || back->id != r->id || back->key != r->key || back->traffic_class != r->traffic_class ||
      !std::equal(back->payload.begin(), back->payload.end(), r->payload.begin(), r->payload.end()))
    std::abort();
}

void check_reply(std::span<const uint8_t> body) {
  auto r = parse_reply(body);
  if (!r) {
    if (r.error().empty()) std::abort();
    return;
  }
  auto back = parse_reply(encode_reply(*r));
  if (!back || back->id != r->id || back->status != r->status || back->message != r->message || back->payload != r->payload)
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::span<const uint8_t> body(data + 1, size - 1);
  if (data[0] & 1)
    check_reply(body);
  else
    check_request(body);
  return 0;
}
