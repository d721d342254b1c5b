// The SWA-cache tier across machines (ISSUE 9 part 3, MISSION.md "SWA cache"):
// - swa_directory_state: the directory as plain state (key → holders), fed only by the
//   stores' reports, so a restarted directory rebuilds itself from them; the directory
//   actor is a thin shell over it that drops a store's keys when the store goes down.
// - the swa_store_actor of a machine over its runtime::swa_store (registered once with the
//   node's transport): describes slots to readers and reports to the directory.
// - swa_fetcher: runtime::remote_swa for the machine's engines. A fetch is queued to reader
//   threads (never the step loop): directory lookup, the holder's slot description, then a
//   one-sided transport read checked against the slot's crc32c; every step bounded by the
//   fetcher's timeout. Any failure completes the fetch with an error (the engine replays).
#pragma once

#include <expected>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/core/swa_store.hpp"
#include "runtime/base/transport.hpp"
#include "runtime/base/work_queue.hpp"

namespace shoal::actors {

class swa_directory_state {
 public:
  void apply(const swa_report& r);
  // The store is gone: its keys go with it.
  void drop(const caf::actor_addr& store);
  swa_hit lookup(const std::vector<runtime::block_key>& keys, const std::string& asker);
  swa_directory_stats stats() const;

 private:
  struct holder {
    std::string node;
    caf::actor store;
    std::set<std::pair<uint64_t, uint64_t>> keys;  // (hi, lo)
  };
  void remove_key(size_t h, const runtime::block_key& k);
  std::vector<holder> holders_;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<size_t>> index_;  // key → holders
  uint64_t lookups_ = 0, hits_ = 0, reports_ = 0, full_reports_ = 0;
};

swa_directory_actor spawn_swa_directory(caf::actor_system& sys);

class swa_fetcher final : public runtime::remote_swa {
 public:
  // node: this machine's name (the directory never answers with its own store).
  swa_fetcher(caf::actor_system& sys, std::shared_ptr<runtime::transport> transport, std::string node,
              std::chrono::milliseconds timeout, size_t readers = 2);
  // Finishes the fetches already queued (each bounded by the timeout).
  ~swa_fetcher() override;
  std::shared_ptr<runtime::slot_fetch> start_fetch(std::vector<runtime::block_key> keys, size_t max_bytes) override;
  // The directory to ask (from the membership; invalid = none: fetches miss at once).
  void set_directory(caf::actor directory);

 private:
  struct job {
    std::vector<runtime::block_key> keys;
    size_t max_bytes = 0;
    std::shared_ptr<runtime::slot_fetch> fetch;
  };
  void serve(job& j);

  caf::actor_system& sys_;
  std::shared_ptr<runtime::transport> transport_;
  std::string node_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  caf::actor directory_;  // under mu_
  runtime::work_queue<job> jobs_;  // last: its readers use what is above
};

struct swa_store_config {
  std::string node;                                  // this machine's node name
  std::shared_ptr<runtime::swa_store> store;
  std::shared_ptr<runtime::transport> transport;     // readers reach the slots through it
  std::shared_ptr<swa_fetcher> fetcher;              // told the directory too (may be null)
  std::chrono::milliseconds report_interval{200};
};

// Registers the store's memory with the transport (an error names the cause), then spawns
// the actor.
std::expected<swa_store_actor, std::string> spawn_swa_store(caf::actor_system& sys, swa_store_config config);

}  // namespace shoal::actors
