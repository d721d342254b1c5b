// Expert parallelism over CAF: the rank actor of one engine and the transport its engine's
// forward pass blocks on. The group is every rank of every engine node naming the same
// engine.ep_group, ordered by (node name, rank index), as the node agent's membership says;
// a membership change interrupts a running exchange (that step fails, its requests end
// as errors and the gateway re-routes them) and the engine adopts the new group between
// steps. Frames go rank actor to rank actor; a frame for a step this rank has not begun
// makes it join that step (lockstep: a rank without work steps with an empty batch).
//
// Formations. The same members form the same group (the same id) again when a process is cut
// off and comes back, and each rank sees membership changes on its own: one may see the
// process leave and return while another never noticed. So every adoption of a group is a
// formation with a number, carried by every frame: a rank adopts a group at one past its
// last formation, or at the formation its peers' waiting frames already use; a frame of a
// lower formation (sent before its sender left it) is dropped, and a peer still sending in an
// earlier formation of the current group is told the current number; a frame of the current
// group at a higher formation means a peer formed it anew, and this rank re-forms at that
// number (its exchange fails, its engine adopts the group again). Numbers only rise to one
// some rank chose on a membership change, so the ranks meet on the highest.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/ep/expert_parallel.hpp"

namespace shoal::actors {

// One rank's view of its group: the frames that arrived, the peers to send to. Control
// travels as CAF messages; with a bulk transport (libfabric), frames of at least
// `bulk_from` bytes stay in this rank's registered send memory and peers read them one-sided
// (the CAF message carries only their description). The send memory is two regions used in
// turn by successive exchanges: a peer has read exchange k's frames before it sends its
// frame of exchange k + 1, which this rank waits for before writing exchange k + 2.
struct ep_bulk_options {
  std::shared_ptr<runtime::transport> transport;  // null: every frame inline in CAF messages
  size_t region_bytes = 8 << 20;                  // per region; larger frames go inline
  size_t bulk_from = 16 << 10;                    // smaller frames go inline
};

class caf_ep_transport final : public runtime::expert_transport {
 public:
  using bulk_options = ep_bulk_options;
  explicit caf_ep_transport(std::chrono::milliseconds timeout, bulk_options bulk = {});
  ~caf_ep_transport() override;

  // expert_transport: sends outgoing[r] to rank r's actor, waits for every peer's frame of
  // (step, slot, phase) in the current group; an error on interrupt or timeout.
  std::expected<runtime::ep_payloads, std::string> exchange(uint64_t step, int32_t slot, int32_t phase,
                                                            runtime::ep_payloads outgoing) override;

  // Rank actor: a frame arrived. join: it belongs to a step of the current formation this rank
  // has not begun (and no join was asked for it yet): the engine must join that step. reform:
  // a peer formed the current group anew (a higher formation): the engine must adopt the group
  // again (set_group then takes that formation); the running exchange fails.
  enum class arrival { none, join, reform };
  arrival deliver(ep_frame f);
  // Rank actor: the group is changing; a running or later exchange fails until set_group.
  void interrupt(const std::string& why);
  // Engine, between steps: adopt a group (a new formation of it: one past the last formation,
  // or that of its frames already waiting, the higher). True when frames of it are already
  // waiting (the engine should then step to join them).
  bool set_group(uint64_t group, int32_t rank, std::vector<rank_actor> peers);
  uint64_t group() const;
  uint64_t formation() const;
  int32_t size() const;
  // The ranks of the current group, in rank order (empty before the first).
  std::vector<rank_actor> peers() const;
  // Frames sent over the bulk transport / inline since construction.
  uint64_t frames_bulk() const { return frames_bulk_; }
  uint64_t frames_inline() const { return frames_inline_; }

 private:
  using key = std::tuple<uint64_t, uint64_t, uint64_t, int32_t, int32_t, int32_t>;  // group, formation, step, slot, phase, source
  struct pending_read {  // a peer's frame being read from its memory
    std::shared_ptr<std::vector<uint8_t>> bytes;
    std::shared_ptr<runtime::transfer> read;
  };
  // Moves outgoing[r] of peers into the send region of this exchange where it pays.
  void stage(std::vector<ep_frame>& frames, runtime::ep_payloads& outgoing);
  void retire(pending_read r);  // mu_ held: an abandoned read, kept until it ends
  void drop_frames(const std::function<bool(const key&)>& drop);  // mu_ held: inbox and reads
  // mu_ held: whether `f` is of the current formation or a later one (else it is dropped, and
  // a peer behind is told this formation); sets `out` to reform for a later one of this group.
  bool admit(const ep_frame& f, arrival& out);
  // Waits for the reads of peers' frames; a group change ends the wait (the reads are retired):
  // its error.
  std::optional<std::string> await_reads(std::vector<std::pair<int32_t, pending_read>>& reading, uint64_t g,
                                         uint64_t fm);

  const bulk_options bulk_;
  std::vector<std::byte> send_memory_;  // 2 regions
  std::unique_ptr<runtime::registered_memory> send_reg_;
  std::string bulk_error_;              // registration failed: inline only
  uint64_t exchanges_ = 0;              // selects the region
  std::atomic<uint64_t> frames_bulk_{0}, frames_inline_{0};
  std::map<key, pending_read> reads_;
  std::vector<pending_read> draining_;

  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t group_ = 0;
  uint64_t formation_ = 0;         // of the current group (0: none yet)
  std::map<uint64_t, uint64_t> seen_;  // group → the highest later formation its frames carried
  std::set<int32_t> noticed_;      // peers told this formation's number
  int32_t rank_ = 0;
  std::vector<rank_actor> peers_;  // by rank; own entry unused
  std::map<key, std::vector<uint8_t>> inbox_;
  std::optional<std::string> interrupted_;
  int64_t last_local_step_ = -1;   // highest step this rank exchanged in the current group
  int64_t last_join_ = -1;         // highest step a join was asked for in the current group
  // This rank's frames of the current group's placement agreement (slot −1, sent inline): sent
  // again to a peer whose agreement frame arrives, since that peer may have missed them (a
  // frame that reached it before it adopted the group is dropped there).
  std::vector<ep_frame> agreement_;
};

// The group `group` of a membership: the ranks of its nodes with node_info::ep_group ==
// group, sorted rank names and their actors; id = FNV-1a of the
// names and the rank actors' addresses (a restarted node is a new group). Plain function,
// tested directly.
struct ep_group_view {
  uint64_t id = 0;
  std::vector<std::string> names;  // "<node>/rank<i>"
  std::vector<caf::actor> ranks;   // rank actors, same order
  std::vector<caf::actor> engines; // their engine actors, same order
  int32_t index_of(const caf::actor& rank) const;
};
ep_group_view ep_group_of(const membership& m, const std::string& group);
// Why `joining` may not join the membership `m`: the first field (checkpoint, engine role,
// group size, speculative depth) on which it disagrees with a member of its expert-parallel
// group, naming both nodes; nullopt when it agrees (or runs no expert-parallel ranks).
std::optional<std::string> ep_join_conflict(const membership& m, const node_info& joining);

// Spawns the rank actor of `engine` (an engine spawned with this transport).
rank_actor spawn_rank(caf::actor_system& sys, std::shared_ptr<caf_ep_transport> transport, engine_actor engine,
                      std::string group);

}  // namespace shoal::actors
