// kv_block_store: key conversion, float blocks as raw bytes, the writer thread.
#include "actors/kv_block_store.hpp"

#include <algorithm>
#include <cstring>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>

namespace shoal::actors {

kv_block_store::kv_block_store(std::unique_ptr<kv_client> client, size_t queue_blocks, size_t write_batch,
                               size_t readers)
    : client_(std::move(client)), capacity_(queue_blocks), write_batch_(std::max<size_t>(1, write_batch)) {
  writer_ = std::thread([this] { run(); });
  for (size_t i = 0; i < std::max<size_t>(1, readers); ++i) readers_.emplace_back([this] { read_loop(); });
}

kv_block_store::~kv_block_store() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  read_cv_.notify_all();
  writer_.join();
  for (auto& r : readers_) r.join();
}

std::shared_ptr<runtime::remote_fetch> kv_block_store::start_fetch(std::vector<runtime::block_key> keys,
                                                                   std::vector<std::span<float>> dsts) {
  auto fetch = std::make_shared<runtime::remote_fetch>();
  {
    std::lock_guard lock(mu_);
    fetches_.push_back({std::move(keys), std::move(dsts), fetch});
  }
  read_cv_.notify_one();
  return fetch;
}

void kv_block_store::read_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    read_cv_.wait(lock, [&] { return !fetches_.empty() || stopping_; });
    if (fetches_.empty()) return;  // stopping, and every queued fetch was served
    fetch_job job = std::move(fetches_.front());
    fetches_.pop_front();
    lock.unlock();
    serve(job);
    lock.lock();
  }
}

// Lookup, then the listed run straight into the caller's blocks; the fetch ends at the first
// block that fails (a miss, a block of another size, too few valid chunks).
void kv_block_store::serve(fetch_job& job) {
  const size_t n = std::min(job.keys.size(), job.dsts.size());
  if (job.fetch->cancelled() || n == 0) return job.fetch->complete(0, 0);
  if (auto why = client_->placement_problem()) return job.fetch->complete(0, 0, *why);  // counted, and said
  const size_t listed = client_->lookup({job.keys.begin(), job.keys.begin() + static_cast<std::ptrdiff_t>(n)});
  if (listed == 0 || job.fetch->cancelled()) return job.fetch->complete(listed, 0);
  std::vector<std::span<uint8_t>> bytes;
  for (size_t i = 0; i < listed; ++i)
    bytes.emplace_back(reinterpret_cast<uint8_t*>(job.dsts[i].data()), job.dsts[i].size_bytes());
  auto got = client_->get_many_into(std::span(job.keys).first(listed), bytes);
  size_t ok = 0;
  while (ok < got.size() && got[ok]) ++ok;
  job.fetch->complete(listed, ok, ok < got.size() ? got[ok].error() : std::string());
}

bool kv_block_store::store_async(const runtime::block_key& key, std::span<const float> src,
                                 runtime::traffic_class cls) {
  std::vector<uint8_t> bytes(src.size_bytes());
  std::memcpy(bytes.data(), src.data(), bytes.size());
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= capacity_) {
      ++counters_.dropped;
      return false;
    }
    queue_.push_back({key, std::move(bytes), cls});
  }
  cv_.notify_one();
  return true;
}

void kv_block_store::set_nodes(std::vector<storage_endpoint> nodes) { client_->set_nodes(std::move(nodes)); }

kv_block_store::counters kv_block_store::stats(bool drain, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (drain) idle_cv_.wait_for(lock, timeout, [&] { return queue_.empty() && !busy_; });
  return counters_;
}

void kv_block_store::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    std::vector<pending> jobs;
    while (!queue_.empty() && jobs.size() < write_batch_) {
      jobs.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    busy_ = true;
    lock.unlock();
    std::vector<kv_client::put_item> items;
    for (const auto& j : jobs) items.push_back({j.key, j.bytes, j.cls});
    auto results = client_->put_many(items);
    lock.lock();
    busy_ = false;
    for (const auto& r : results) ++(r ? counters_.written : counters_.failed);
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

caf::actor spawn_storage_watcher(caf::actor_system& sys, std::shared_ptr<kv_block_store> store) {
  return sys.spawn([store](caf::event_based_actor*) -> caf::behavior {
    return {[store](const membership& m) { store->set_nodes(kv_client::nodes_of(m)); }};
  });
}

}  // namespace shoal::actors
