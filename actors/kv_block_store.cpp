// kv_block_store: key conversion, blocks as their format's header then their bytes, the writer
// thread.
#include "actors/kv_block_store.hpp"

#include <algorithm>
#include <cstring>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>

namespace shoal::actors {

// A fetch refused at once when this many wait for a reader (the engine recomputes its blocks).
constexpr size_t fetch_queue_limit = 1024;

kv_block_store::kv_block_store(std::unique_ptr<kv_client> client, size_t queue_blocks, size_t write_batch,
                               size_t readers)
    : client_(std::move(client)),
      writes_(1, queue_blocks, write_batch, [this](std::span<pending> batch) { write(batch); },
              runtime::work_queue<pending>::on_stop::drop),
      fetches_(readers, fetch_queue_limit, 1, [this](std::span<fetch_job> jobs) { serve(jobs.front()); }) {}

kv_block_store::~kv_block_store() = default;

std::shared_ptr<runtime::remote_fetch> kv_block_store::start_fetch(std::vector<runtime::block_key> keys,
                                                                   std::vector<std::span<std::byte>> dsts,
                                                                   const model::kv_format& f) {
  auto fetch = std::make_shared<runtime::remote_fetch>();
  if (!fetches_.push({std::move(keys), std::move(dsts), f, fetch}))
    fetch->complete(0, 0, std::to_string(fetch_queue_limit) + " storage fetches wait already");
  return fetch;
}

// Lookup, then the listed run, each block's header checked before its bytes go into the
// caller's block; the fetch ends at the first block that fails (a miss, a block of another
// format or size, too few valid chunks).
void kv_block_store::serve(fetch_job& job) {
  const size_t n = std::min(job.keys.size(), job.dsts.size());
  if (job.fetch->cancelled() || n == 0) return job.fetch->complete(0, 0);
  if (auto why = client_->placement_problem()) return job.fetch->complete(0, 0, *why);  // counted, and said
  const size_t listed = client_->lookup({job.keys.begin(), job.keys.begin() + static_cast<std::ptrdiff_t>(n)});
  if (listed == 0 || job.fetch->cancelled()) return job.fetch->complete(listed, 0);
  auto got = client_->get_many(std::span(job.keys).first(listed));
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i]) return job.fetch->complete(listed, i, got[i].error());
    const std::vector<uint8_t>& stored = *got[i];
    auto f = model::read_block_header(stored);
    if (!f) return job.fetch->complete(listed, i, "block " + std::to_string(i) + " has no KV format header");
    if (*f != job.format)
      return job.fetch->complete(listed, i, "block " + std::to_string(i) + " is stored as " + f->describe() +
                                                ", this engine's are " + job.format.describe(), true);
    const std::span<std::byte> dst = job.dsts[i];
    if (stored.size() != model::kv_block_header_bytes + dst.size())
      return job.fetch->complete(listed, i, "block " + std::to_string(i) + " holds " + std::to_string(stored.size()) +
                                                " bytes, its header and format make " +
                                                std::to_string(model::kv_block_header_bytes + dst.size()));
    std::memcpy(dst.data(), stored.data() + model::kv_block_header_bytes, dst.size());
  }
  job.fetch->complete(listed, got.size());
}

bool kv_block_store::store_async(const runtime::block_key& key, std::span<const std::byte> src,
                                 const model::kv_format& f, runtime::traffic_class cls) {
  std::vector<uint8_t> bytes(model::kv_block_header_bytes + src.size());
  model::write_block_header(f, bytes.data());
  std::memcpy(bytes.data() + model::kv_block_header_bytes, src.data(), src.size());
  if (writes_.push({key, std::move(bytes), cls})) return true;
  std::lock_guard lock(mu_);
  ++counters_.dropped;
  return false;
}

void kv_block_store::set_nodes(std::vector<storage_endpoint> nodes) { client_->set_nodes(std::move(nodes)); }

kv_block_store::counters kv_block_store::stats(bool drain, std::chrono::milliseconds timeout) {
  if (drain) writes_.wait_idle(timeout);
  std::lock_guard lock(mu_);
  return counters_;
}

void kv_block_store::write(std::span<pending> batch) {
  std::vector<kv_client::put_item> items;
  for (const auto& j : batch) items.push_back({j.key, j.bytes, j.cls});
  auto results = client_->put_many(items);
  std::lock_guard lock(mu_);
  for (const auto& r : results) ++(r ? counters_.written : counters_.failed);
}

caf::actor spawn_storage_watcher(caf::actor_system& sys, std::shared_ptr<kv_block_store> store) {
  return sys.spawn([store](caf::event_based_actor*) -> caf::behavior {
    return {[store](const membership& m) { store->set_nodes(kv_client::nodes_of(m)); }};
  });
}

}  // namespace shoal::actors
