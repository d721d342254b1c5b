// libfabric RDM + RMA backend of runtime::transport (fabric_transport.hpp): bring-up
// (fi_getinfo → fabric → domain → av, cq → endpoint), registrations, reads split at the
// provider's message size, and the progress thread that drains the completion queue, checks
// deadlines and verifies each finished read's crc32c.
#include "transport/fabric_transport.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <signal.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "kernels/assert.hpp"
#include "storage/crc32c.hpp"

namespace shoal::transport {

namespace {

std::string fi_error(const char* what, int rc) { return std::string(what) + ": " + fi_strerror(-rc); }

// Closes a libfabric object (null-safe).
template <class T>
void close_fid(T*& obj) {
  if (obj) fi_close(&obj->fid);
  obj = nullptr;
}

}  // namespace

// One read: its pieces (fi_read calls) share it; done when every piece has come back.
struct read_op {
  std::shared_ptr<runtime::transfer> result;
  std::span<std::byte> dst;
  // Where the provider writes: dst, or (a provider that needs the owner's progress to finish a
  // read) this buffer, copied to dst when the read succeeds, so that a read ended at its
  // deadline while the provider still holds it never writes into the caller's memory.
  std::unique_ptr<std::byte[]> staging;
  std::vector<std::pair<std::span<std::byte>, uint32_t>> checks;  // parts of where it lands and their crc32c
  fid_mr* local_mr = nullptr;  // FI_MR_LOCAL: where it lands, registered for the read
  bool reported = false;       // the result went to the caller
  size_t pieces_out = 0;
  bool posting = true;         // pieces still being posted
  std::string error;
  runtime::errc code = runtime::errc::unavailable;  // of `error`
  std::chrono::steady_clock::time_point deadline;
  bool cancelled = false;
  void fail(runtime::errc c, std::string why) {  // the first failure stays
    if (!error.empty()) return;
    error = std::move(why);
    code = c;
  }
};

// One fi_read. A piece the provider has no room for yet (rxm still connecting to a new peer,
// a full queue) waits in the transport's queue; the progress thread posts it when the provider
// takes it, or ends it at its read's deadline.
struct piece {
  fi_context2 ctx;  // first: the completion's op_context points here
  read_op* op;
  std::byte* buf = nullptr;
  size_t len = 0;
  void* desc = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  uint64_t remote_addr = 0, key = 0;
  bool posted = false;

  ssize_t post(fid_ep* ep) { return fi_read(ep, buf, len, desc, peer, remote_addr, key, &ctx); }
};

struct fabric_transport::state {
  fabric_config cfg;
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  std::vector<uint8_t> addr;
  uint64_t mr_mode = 0;
  size_t max_msg = 0;
  bool cq_waits = false;  // the cq has a wait object: the progress thread sleeps in fi_cq_sread

  std::mutex mu;  // guards everything below
  std::map<std::vector<uint8_t>, fi_addr_t> peers;
  std::list<read_op> ops;
  std::list<piece> pieces;
  std::deque<piece*> unposted;  // pieces the provider did not take yet, in posting order
  uint64_t next_key = 1;
  bool stopping = false;
  std::thread progress;
  // Polling without a wait object (run()): the pause when idle, and what wakes it early.
  std::chrono::microseconds idle_pause{50};
  std::mutex poll_mu;
  std::condition_variable poll_cv;
  bool woken = false;  // guarded by poll_mu

  ~state() {
    close_fid(ep);
    close_fid(av);
    close_fid(cq);
    close_fid(domain);
    close_fid(fabric);
    if (info) fi_freeinfo(info);
  }

  bool needs(uint64_t mode) const { return (mr_mode & mode) != 0; }

  std::expected<fid_mr*, std::string> reg(const void* p, size_t n, uint64_t access) {
    fid_mr* mr = nullptr;
    uint64_t key = 0;
    {
      std::lock_guard lock(mu);
      key = next_key++;
    }
    if (int rc = fi_mr_reg(domain, p, n, access, 0, key, 0, &mr, nullptr); rc)
      return std::unexpected(fi_error("fi_mr_reg", rc));
    if (needs(FI_MR_ENDPOINT)) {
      int rc = fi_mr_bind(mr, &ep->fid, 0);
      if (!rc) rc = fi_mr_enable(mr);
      if (rc) {
        fi_close(&mr->fid);
        return std::unexpected(fi_error("fi_mr_bind/enable", rc));
      }
    }
    return mr;
  }

  std::expected<fi_addr_t, std::string> peer(const std::vector<uint8_t>& a) {
    std::lock_guard lock(mu);
    if (auto it = peers.find(a); it != peers.end()) return it->second;
    if (a.size() != addr.size())
      return std::unexpected("owner address is " + std::to_string(a.size()) + " bytes; " + cfg.provider +
                             " addresses are " + std::to_string(addr.size()));
    if (auto gone = shm_peer_gone(a)) return std::unexpected(*gone);
    fi_addr_t fa = FI_ADDR_UNSPEC;
    if (int n = fi_av_insert(av, a.data(), 1, &fa, 0, nullptr); n != 1)
      return std::unexpected("owner address not accepted by " + cfg.provider + " (fi_av_insert returned " +
                             std::to_string(n) + ")");
    peers.emplace(a, fa);
    return fa;
  }

  // libfabric 1.17's shm provider maps a peer's region at fi_av_insert and crashes when the
  // region is gone (its owner closed or exited), so shm addresses ("fi_shm://<region>") are
  // checked against /dev/shm first. A peer that goes away between this check and the insert
  // still hits the provider's bug; reads of a peer already inserted fail cleanly.
  std::optional<std::string> shm_peer_gone(const std::vector<uint8_t>& a) const {
    if (cfg.provider != "shm") return std::nullopt;
    std::string name(a.begin(), std::find(a.begin(), a.end(), uint8_t{0}));
    const std::string scheme = "fi_shm://";
    if (name.rfind(scheme, 0) != 0 || name.size() == scheme.size() || name.find('/', scheme.size()) != std::string::npos)
      return "owner address '" + name + "' is not a shm address";
    if (::access(("/dev/shm/" + name.substr(scheme.size())).c_str(), F_OK) != 0)
      return "owner " + name + " is gone (its shm region no longer exists)";
    return std::nullopt;
  }

  // Under mu: a piece came back (err: why it failed, "" when it succeeded).
  void piece_done(piece* p, const std::string& err, runtime::errc code = runtime::errc::unavailable) {
    read_op* op = p->op;
    if (!err.empty()) op->fail(code, err);
    --op->pieces_out;
    pieces.remove_if([&](const piece& x) { return &x == p; });
    finish_if_done(op);
  }

  void finish_if_done(read_op* op) {
    if (op->posting || op->pieces_out > 0) return;
    if (op->local_mr) fi_close(&op->local_mr->fid);
    if (!op->reported) report(*op);
    ops.remove_if([&](const read_op& x) { return &x == op; });
  }

  // Under mu: the read's result to its caller, once: the checksums of what landed, copied to
  // the caller's memory from staging; a read still out (abandoned at its deadline) fails.
  void report(read_op& op) {
    op.reported = true;
    if (op.cancelled) op.fail(runtime::errc::timed_out, "read timed out");
    for (const auto& [part, crc] : op.checks) {
      if (!op.error.empty()) break;
      const uint32_t got = storage::crc32c(part.data(), part.size());
      if (got != crc)
        op.fail(runtime::errc::corrupt, "checksum mismatch: crc32c of the bytes read " + std::to_string(got) +
                                          " != described " + std::to_string(crc) +
                                          " (the owner's memory changed or was released)");
    }
    if (op.error.empty() && op.staging) std::memcpy(op.dst.data(), op.staging.get(), op.dst.size());
    if (op.error.empty()) op.result->complete();
    else op.result->fail(op.code, std::move(op.error));
  }

  void drain_cq() {
    fi_cq_entry entries[16];
    for (;;) {
      ssize_t n = fi_cq_read(cq, entries, 16);
      if (n == -FI_EAGAIN) return;
      std::lock_guard lock(mu);
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry e{};
        if (fi_cq_readerr(cq, &e, 0) < 0) return;
        char buf[256] = {};
        const char* detail = fi_cq_strerror(cq, e.prov_errno, e.err_data, buf, sizeof buf);
        auto* p = static_cast<piece*>(e.op_context);
        // The owner's side rejected the key or range, or the read could not reach it.
        const auto code = e.err == FI_EACCES || e.err == FI_EKEYREJECTED || e.err == FI_EINVAL
                            ? runtime::errc::refused
                            : runtime::errc::unavailable;
        if (p)
          piece_done(p, std::string("fi_read failed: ") + fi_strerror(e.err) + (detail ? std::string(" (") + detail + ")" : ""),
                     code);
        continue;
      }
      if (n < 0) return;
      for (ssize_t i = 0; i < n; ++i) piece_done(static_cast<piece*>(entries[i].op_context), "");
    }
  }

  void check_deadlines() {
    std::lock_guard lock(mu);
    const auto now = std::chrono::steady_clock::now();
    for (auto& op : ops)
      if (!op.cancelled && now >= op.deadline) {
        op.cancelled = true;
        op.fail(runtime::errc::timed_out, "read timed out (owner gone or not progressing)");
        for (auto& p : pieces)
          if (p.op == &op && p.posted) fi_cancel(&ep->fid, &p.ctx);  // comes back as a canceled completion, if at all
      }
    abandon_stuck(now);
  }

  // Under mu: reads past their deadline whose pieces the provider still holds a moment after
  // fi_cancel (tcp;ofi_rxm cancels no posted read, and a stopped owner keeps its connection
  // open and answers nothing: the read would wait for it as long as the owner is stopped).
  // A read that lands in its staging buffer ends for its caller now, as timed out; the
  // provider may still write into the staging buffer, never into the caller's memory, and the
  // read's bookkeeping goes when its last piece comes back.
  void abandon_stuck(std::chrono::steady_clock::time_point now) {
    constexpr auto grace = std::chrono::milliseconds(20);
    for (auto& op : ops)
      if (op.cancelled && !op.reported && op.staging && op.pieces_out > 0 && now >= op.deadline + grace) report(op);
  }

  // Posts the queued pieces in order until the provider takes no more; pieces of a read
  // past its deadline (or failed already) end without being posted.
  void post_queued() {
    std::lock_guard lock(mu);
    while (!unposted.empty()) {
      piece* p = unposted.front();
      if (p->op->cancelled || !p->op->error.empty()) {
        unposted.pop_front();
        piece_done(p, p->op->error, p->op->code);
        continue;
      }
      const ssize_t rc = p->post(ep);
      if (rc == -FI_EAGAIN) return;
      unposted.pop_front();
      if (rc) piece_done(p, fi_error("fi_read", static_cast<int>(rc)));
      else p->posted = true;
    }
  }

  // Under mu: how long the progress thread may sleep before it must look again: until the
  // nearest read deadline, at most 100 ms (a completion or fi_cq_signal wakes it earlier).
  std::chrono::milliseconds sleep_budget() const {
    auto wait = std::chrono::milliseconds(100);
    const auto now = std::chrono::steady_clock::now();
    for (const auto& op : ops)  // a cancelled one: abandoned a moment later if still out
      if (!op.reported)
        wait = std::min(wait, std::max(std::chrono::milliseconds(op.cancelled ? 5 : 0),
                                       std::chrono::ceil<std::chrono::milliseconds>(op.deadline - now)));
    return wait;
  }

  void run() {
    fi_cq_entry entries[16];
    for (;;) {
      {
        std::lock_guard lock(mu);
        if (stopping) return;
      }
      drain_cq();
      check_deadlines();
      post_queued();
      bool retry_posts, busy;
      std::chrono::milliseconds wait;
      {
        std::lock_guard lock(mu);
        retry_posts = !unposted.empty();
        busy = !ops.empty();
        wait = sleep_budget();
      }
      // A piece the provider refused (rxm still connecting) is retried every 100 µs: no
      // completion would wake the thread for it. Without a wait object the thread polls: every
      // 20 µs while reads of its own are out, backing off to 1 ms when idle (each poll also
      // serves peers reading this endpoint's memory); a new read wakes it at once.
      if (retry_posts || !cq_waits) {
        using std::chrono::microseconds;
        microseconds pause = retry_posts ? microseconds(100) : busy ? microseconds(20) : idle_pause;
        idle_pause = busy ? microseconds(50) : std::min(idle_pause * 2, microseconds(1000));
        std::unique_lock lock(poll_mu);
        poll_cv.wait_for(lock, pause, [&] { return woken; });
        woken = false;
        continue;
      }
      // Sleeps in the provider's wait object until a completion, a peer's request for this
      // endpoint's memory (manual data progress: the owner's side runs here too), a signal
      // from post() or the destructor, or the nearest deadline. A busy loop here took a
      // core from the engines of a 2-core machine whenever a read was out.
      const ssize_t n = fi_cq_sread(cq, entries, 16, nullptr, static_cast<int>(wait.count()));
      if (n > 0) {
        std::lock_guard lock(mu);
        for (ssize_t i = 0; i < n; ++i) piece_done(static_cast<piece*>(entries[i].op_context), "");
      }  // errors (-FI_EAVAIL) and timeouts: the next drain_cq sees them
    }
  }

  // May be called with mu held.
  void wake() {
    if (cq_waits) {
      fi_cq_signal(cq);
      return;
    }
    {
      std::lock_guard lock(poll_mu);
      woken = true;
    }
    poll_cv.notify_one();
  }
};

namespace {

class fabric_registration final : public runtime::registered_memory {
 public:
  fabric_registration(std::shared_ptr<fabric_transport::state> s, fid_mr* mr, std::span<const std::byte> bytes)
      : s_(std::move(s)), mr_(mr), bytes_(bytes) {}
  ~fabric_registration() override { fi_close(&mr_->fid); }

  runtime::remote_memory describe(uint64_t offset, uint64_t length) const override {
    runtime::remote_memory m = locate(offset, length);
    m.crc32c = storage::crc32c(bytes_.data() + (offset < bytes_.size() ? offset : bytes_.size()), m.length);
    return m;
  }
  runtime::remote_memory locate(uint64_t offset, uint64_t length) const {
    runtime::remote_memory m;
    m.owner = s_->addr;
    const uint64_t off = std::min<uint64_t>(offset, bytes_.size());
    m.length = std::min<uint64_t>(length, bytes_.size() - off);
    m.addr = (s_->needs(FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(bytes_.data()) : 0) + off;
    m.key = fi_mr_key(mr_);
    return m;
  }

 private:
  std::shared_ptr<fabric_transport::state> s_;
  fid_mr* mr_;
  std::span<const std::byte> bytes_;
};

}  // namespace

size_t sweep_stale_shm_regions(const std::string& dir) {
  std::error_code ec;
  const auto me = static_cast<unsigned long>(::getpid()), uid = static_cast<unsigned long>(::getuid());
  size_t removed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789:") != std::string::npos) continue;
    unsigned long pid = 0, owner = 0, n = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "%lu:%lu:%lu%n", &pid, &owner, &n, &used) != 3 || used != static_cast<int>(name.size()))
      continue;
    if (owner != uid || pid == 0) continue;
    const bool gone = pid != me && ::kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH;
    if ((pid == me || gone) && std::filesystem::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

namespace {

// fi_getinfo → fabric → domain → av, cq → endpoint → its address; errors name the step.
std::expected<std::shared_ptr<fabric_transport::state>, std::string> bring_up(const fabric_config& cfg) {
  using state = fabric_transport::state;
  auto s = std::make_shared<state>();
  s->cfg = cfg;
  const std::string where = "libfabric provider '" + cfg.provider + "'";
  if (cfg.provider == "shm") {  // once a process (a forked child is another: its pid is new)
    static std::mutex mu;
    static pid_t swept_by = 0;
    std::lock_guard lock(mu);
    if (std::exchange(swept_by, ::getpid()) != ::getpid()) sweep_stale_shm_regions("/dev/shm");
  }
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->fabric_attr->prov_name = strdup(cfg.provider.c_str());
  int rc = fi_getinfo(FI_VERSION(1, 17), cfg.node.empty() ? nullptr : cfg.node.c_str(), nullptr,
                      cfg.node.empty() ? 0 : FI_SOURCE, hints, &s->info);
  fi_freeinfo(hints);
  if (rc || !s->info)
    return std::unexpected(where + " (node '" + cfg.node + "'): no RDM endpoint with one-sided reads: " +
                           fi_error("fi_getinfo", rc) + " (fi_info -l lists the providers here)");
  s->mr_mode = s->info->domain_attr->mr_mode;
  s->max_msg = std::max<size_t>(1, s->info->ep_attr->max_msg_size);
  if ((rc = fi_fabric(s->info->fabric_attr, &s->fabric, nullptr))) return std::unexpected(where + ": " + fi_error("fi_fabric", rc));
  if ((rc = fi_domain(s->fabric, s->info, &s->domain, nullptr))) return std::unexpected(where + ": " + fi_error("fi_domain", rc));
  fi_av_attr av{};
  av.type = FI_AV_TABLE;
  if ((rc = fi_av_open(s->domain, &av, &s->av, nullptr))) return std::unexpected(where + ": " + fi_error("fi_av_open", rc));
  fi_cq_attr cq{};
  cq.format = FI_CQ_FORMAT_CONTEXT;
  cq.size = 1024;
  // A wait object the progress thread can sleep in: a file descriptor or a condition
  // variable. Not the provider's default: shm's is a sched_yield loop, which took a whole core
  // from an idle daemon. Without one the thread polls (run()).
  for (auto obj : {FI_WAIT_FD, FI_WAIT_MUTEX_COND}) {
    cq.wait_obj = obj;
    if ((s->cq_waits = fi_cq_open(s->domain, &cq, &s->cq, nullptr) == 0)) break;
  }
  if (!s->cq_waits) {
    cq.wait_obj = FI_WAIT_NONE;
    if ((rc = fi_cq_open(s->domain, &cq, &s->cq, nullptr))) return std::unexpected(where + ": " + fi_error("fi_cq_open", rc));
  }
  if ((rc = fi_endpoint(s->domain, s->info, &s->ep, nullptr))) return std::unexpected(where + ": " + fi_error("fi_endpoint", rc));
  if ((rc = fi_ep_bind(s->ep, &s->av->fid, 0))) return std::unexpected(where + ": " + fi_error("fi_ep_bind(av)", rc));
  if ((rc = fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV)))
    return std::unexpected(where + ": " + fi_error("fi_ep_bind(cq)", rc));
  if ((rc = fi_enable(s->ep))) return std::unexpected(where + ": " + fi_error("fi_enable", rc));
  size_t len = 0;
  fi_getname(&s->ep->fid, nullptr, &len);
  s->addr.resize(len);
  if ((rc = fi_getname(&s->ep->fid, s->addr.data(), &len)))
    return std::unexpected(where + ": " + fi_error("fi_getname", rc));
  s->addr.resize(len);
  return s;
}

}  // namespace

std::expected<std::unique_ptr<fabric_transport>, std::string> fabric_transport::create(const fabric_config& cfg) {
  auto s = bring_up(cfg);
  if (!s) return std::unexpected(s.error());
  (*s)->progress = std::thread([raw = s->get()] { raw->run(); });
  return std::unique_ptr<fabric_transport>(new fabric_transport(std::move(*s)));
}

std::expected<double, std::string> raw_read_seconds(const fabric_config& cfg, std::span<const runtime::remote_memory> ranges,
                                                    std::span<std::byte> dst, size_t inflight) {
  auto up = bring_up(cfg);
  if (!up) return std::unexpected(up.error());
  auto& s = **up;
  size_t total = 0;
  for (const auto& r : ranges) total += r.length;
  if (total > dst.size()) return std::unexpected("destination smaller than the ranges");
  fid_mr* local = nullptr;
  if (s.needs(FI_MR_LOCAL)) {
    auto mr = s.reg(dst.data(), dst.size(), FI_READ);
    if (!mr) return std::unexpected(mr.error());
    local = *mr;
  }
  void* desc = local ? fi_mr_desc(local) : nullptr;
  std::optional<fi_addr_t> fa;
  if (!ranges.empty()) {
    auto p = s.peer(ranges[0].owner);
    if (!p) return std::unexpected(p.error());
    fa = *p;
  }
  std::vector<fi_context2> ctx(ranges.size());
  const double t0 = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  size_t posted = 0, done = 0, off = 0;
  std::string error;
  fi_cq_entry entries[16];
  while (done < ranges.size() && error.empty()) {
    while (posted < ranges.size() && posted - done < inflight) {
      const auto& r = ranges[posted];
      ssize_t rc = fi_read(s.ep, dst.data() + off, r.length, desc, *fa, r.addr, r.key, &ctx[posted]);
      if (rc == -FI_EAGAIN) break;
      if (rc) {
        error = fi_error("fi_read", static_cast<int>(rc));
        break;
      }
      off += r.length;
      ++posted;
    }
    ssize_t n = fi_cq_read(s.cq, entries, 16);
    if (n > 0) done += static_cast<size_t>(n);
    else if (n == -FI_EAVAIL) error = "a read failed";
  }
  const double t1 = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (local) fi_close(&local->fid);
  if (!error.empty()) return std::unexpected(error);
  return t1 - t0;
}

fabric_transport::fabric_transport(std::shared_ptr<state> s) : s_(std::move(s)) {}

fabric_transport::~fabric_transport() {
  {
    std::lock_guard lock(s_->mu);
    s_->stopping = true;
  }
  s_->wake();
  s_->progress.join();
  close_fid(s_->ep);  // what is still in flight ends here
  std::lock_guard lock(s_->mu);
  for (auto& op : s_->ops) {
    if (op.local_mr) fi_close(&op.local_mr->fid);
    op.result->fail(runtime::errc::unavailable, "transport closed");
  }
  s_->ops.clear();
  s_->unposted.clear();
  s_->pieces.clear();
}

runtime::remote_memory locate(const runtime::registered_memory& r, uint64_t offset, uint64_t length) {
  const auto* f = dynamic_cast<const fabric_registration*>(&r);
  SHOAL_ASSERT(f != nullptr);
  return f->locate(offset, length);
}

std::string fabric_transport::name() const { return "libfabric " + s_->cfg.provider; }

std::vector<uint8_t> fabric_transport::address() const { return s_->addr; }

std::expected<std::unique_ptr<runtime::registered_memory>, std::string> fabric_transport::register_memory(
    std::span<const std::byte> bytes) {
  if (bytes.empty()) return std::unexpected("cannot register an empty range");
  auto mr = s_->reg(bytes.data(), bytes.size(), FI_REMOTE_READ);
  if (!mr) return std::unexpected(name() + ": " + mr.error());
  return std::make_unique<fabric_registration>(s_, *mr, bytes);
}

std::shared_ptr<runtime::transfer> fabric_transport::read(const runtime::remote_memory& src, std::span<std::byte> dst,
                                                          std::chrono::milliseconds timeout) {
  if (dst.size() != src.length) {
    auto result = std::make_shared<runtime::transfer>();
    result->fail(runtime::errc::invalid_argument,
                 "destination is " + std::to_string(dst.size()) + " bytes, the range " + std::to_string(src.length));
    return result;
  }
  return post(src, src.addr, dst, {{0, dst.size(), src.crc32c}}, timeout);
}

std::vector<std::shared_ptr<runtime::transfer>> fabric_transport::read_all(
    std::span<const runtime::remote_memory> srcs, std::span<const std::span<std::byte>> dsts,
    std::chrono::milliseconds timeout) {
  std::vector<std::shared_ptr<runtime::transfer>> out;
  const size_t n = std::min(srcs.size(), dsts.size());
  auto step = [&](size_t a, size_t b) {  // +1 / −1: b follows a (above / below) on both sides; 0: not adjacent
    const auto& x = srcs[a];
    const auto& y = srcs[b];
    if (x.owner != y.owner || x.key != y.key || x.length != y.length || dsts[a].size() != x.length ||
        dsts[b].size() != y.length || x.length == 0)
      return 0;
    const auto len = static_cast<std::ptrdiff_t>(x.length);
    const std::ptrdiff_t ds = static_cast<std::ptrdiff_t>(y.addr - x.addr), dd = dsts[b].data() - dsts[a].data();
    if (ds != dd) return 0;
    return ds == len ? 1 : ds == -len ? -1 : 0;
  };
  for (size_t i = 0; i < n;) {
    size_t j = i;
    const int dir = i + 1 < n ? step(i, i + 1) : 0;
    if (dir != 0)
      while (j + 1 < n && step(j, j + 1) == dir) ++j;
    if (j == i) {
      out.push_back(read(srcs[i], dsts[i], timeout));
      ++i;
      continue;
    }
    const size_t lo = dir > 0 ? i : j;  // the run's lowest address, on both sides
    const size_t len = srcs[i].length;
    std::span<std::byte> dst(dsts[lo].data(), (j - i + 1) * len);
    std::vector<part> parts;
    for (size_t k = i; k <= j; ++k)
      parts.push_back({static_cast<size_t>(srcs[k].addr - srcs[lo].addr), len, srcs[k].crc32c});
    out.push_back(post(srcs[lo], srcs[lo].addr, dst, std::move(parts), timeout));
    i = j + 1;
  }
  return out;
}

std::shared_ptr<runtime::transfer> fabric_transport::post(const runtime::remote_memory& src, uint64_t addr,
                                                          std::span<std::byte> dst, std::vector<part> parts,
                                                          std::chrono::milliseconds timeout) {
  auto result = std::make_shared<runtime::transfer>();
  auto fa = s_->peer(src.owner);
  if (!fa) {
    result->fail(runtime::errc::unavailable, name() + ": " + fa.error());
    return result;
  }
  // shm reads the owner's memory without its help; other providers need the owner to progress.
  std::unique_ptr<std::byte[]> staging;
  if (s_->cfg.provider != "shm" && !dst.empty()) staging = std::make_unique_for_overwrite<std::byte[]>(dst.size());
  const std::span<std::byte> land = staging ? std::span(staging.get(), dst.size()) : dst;
  fid_mr* local = nullptr;
  if (s_->needs(FI_MR_LOCAL) && !dst.empty()) {
    auto mr = s_->reg(land.data(), land.size(), FI_READ);
    if (!mr) {
      result->fail(runtime::errc::unavailable, name() + ": registering the destination: " + mr.error());
      return result;
    }
    local = *mr;
  }
  read_op* op;
  {
    std::lock_guard lock(s_->mu);
    op = &s_->ops.emplace_back();
    op->result = result;
    op->dst = dst;
    op->staging = std::move(staging);
    for (const auto& p : parts) op->checks.emplace_back(land.subspan(p.offset, p.length), p.crc);
    op->local_mr = local;
    op->deadline = std::chrono::steady_clock::now() + timeout;
  }
  void* desc = local ? fi_mr_desc(local) : nullptr;
  // The caller is a step loop: it never waits for the provider. A piece the provider does not
  // take at once (rxm connecting to a new peer, a full queue) and every piece after it go to
  // the queue the progress thread posts from, up to the read's deadline.
  bool queueing;
  {
    std::lock_guard lock(s_->mu);
    queueing = !s_->unposted.empty();  // keep the order of reads already waiting
  }
  for (size_t off = 0; off < dst.size();) {
    const size_t n = std::min(s_->max_msg, dst.size() - off);
    piece* p;
    {
      std::lock_guard lock(s_->mu);
      p = &s_->pieces.emplace_back();
      p->op = op;
      p->buf = land.data() + off;
      p->len = n;
      p->desc = desc;
      p->peer = *fa;
      p->remote_addr = addr + off;
      p->key = src.key;
      ++op->pieces_out;
      if (queueing) s_->unposted.push_back(p);
      else p->posted = true;  // before the call: once posted, its completion may free it at once
    }
    off += n;
    if (queueing) continue;
    const ssize_t rc = p->post(s_->ep);
    if (rc == 0) continue;  // p may be gone already
    std::lock_guard lock(s_->mu);
    p->posted = false;
    if (rc == -FI_EAGAIN) {
      queueing = true;
      s_->unposted.push_back(p);
    } else {
      s_->piece_done(p, fi_error("fi_read", static_cast<int>(rc)));
      break;
    }
  }
  std::lock_guard lock(s_->mu);
  op->posting = false;
  if (queueing || !s_->cq_waits) s_->wake();  // the progress thread posts the rest, or polls sooner
  s_->finish_if_done(op);
  return result;
}

}  // namespace shoal::transport
