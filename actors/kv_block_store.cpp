// kv_block_store: key conversion, float blocks as raw bytes, the writer thread.
#include "actors/kv_block_store.hpp"

#include <algorithm>
#include <cstring>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>

namespace shoal::actors {

namespace {

block_key to_storage_key(const runtime::block_key& k) { return {k.hi, k.lo}; }

}  // namespace

kv_block_store::kv_block_store(std::unique_ptr<kv_client> client, size_t queue_blocks, size_t write_batch)
    : client_(std::move(client)), capacity_(queue_blocks), write_batch_(std::max<size_t>(1, write_batch)) {
  writer_ = std::thread([this] { run(); });
}

kv_block_store::~kv_block_store() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

size_t kv_block_store::lookup(std::span<const runtime::block_key> keys) {
  std::vector<block_key> chain;
  for (const auto& k : keys) chain.push_back(to_storage_key(k));
  return client_->lookup(chain);
}

bool kv_block_store::fetch(const runtime::block_key& key, std::span<float> dst) {
  return fetch_many({&key, 1}, {&dst, 1}) == 1;
}

size_t kv_block_store::fetch_many(std::span<const runtime::block_key> keys, std::span<const std::span<float>> dsts) {
  std::vector<block_key> wanted;
  for (size_t i = 0; i < keys.size() && i < dsts.size(); ++i) wanted.push_back(to_storage_key(keys[i]));
  auto blocks = client_->get_many(wanted);
  size_t n = 0;
  for (; n < blocks.size(); ++n) {
    const auto& b = blocks[n];
    if (!b || b->size() != dsts[n].size_bytes()) break;  // a miss, or a block of another shape
    std::memcpy(dsts[n].data(), b->data(), b->size());
  }
  return n;
}

bool kv_block_store::store_async(const runtime::block_key& key, std::span<const float> src, int traffic_class) {
  std::vector<uint8_t> bytes(src.size_bytes());
  std::memcpy(bytes.data(), src.data(), bytes.size());
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= capacity_) {
      ++counters_.dropped;
      return false;
    }
    queue_.push_back({key, std::move(bytes), traffic_class});
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
    for (const auto& j : jobs) items.push_back({to_storage_key(j.key), j.bytes, j.traffic_class});
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
