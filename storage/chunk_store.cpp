// Chunk store core: open/scan, put, get, exists, remove and leases (GC and TTL sweep live in
// gc.cpp). Index changes and the renames/unlinks that publish them happen under mu_, so the index
// and the directory never disagree; payload writes, fsyncs and reads happen outside it.
#include "storage/chunk_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <limits>

#include "kernels/assert.hpp"
#include "runtime/base/fault_points.hpp"

namespace shoal::storage {

namespace {

store_error sys_error(const char* call, const std::string& path, int err) {
  return {err == ENOSPC ? store_errc::disk_full : store_errc::io,
          std::string(call) + " " + path + ": " + std::strerror(err)};
}

int parse_shard(std::string_view n) {
  int v = 0;
  for (const char c : n) {
    if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
    else if (c >= 'a' && c <= 'f') v = v * 16 + (c - 'a' + 10);
    else return -1;
  }
  return v;
}

int make_dir(const std::string& path, bool& created) {
  created = false;
  if (::mkdir(path.c_str(), 0755) == 0) {
    created = true;
    return 0;
  }
  return errno == EEXIST ? 0 : errno;
}

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads and verifies one chunk file. Returns the header and (if want_payload) the payload;
// store_errc::corrupt for any format or crc failure, not_found if the file is gone.
store_result<chunk_header> read_chunk_file(const std::string& path, const chunk_key* expect,
                                           std::vector<std::byte>* payload, uint64_t* file_bytes) {
  fd_guard f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    if (errno == ENOENT) return std::unexpected(store_error{store_errc::not_found, path});
    return std::unexpected(sys_error("open", path, errno));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return std::unexpected(sys_error("fstat", path, errno));
  const auto corrupt = [&](const char* why) {
    return std::unexpected(store_error{store_errc::corrupt, path + ": " + why});
  };
  if (uint64_t(st.st_size) < file_header_bytes) return corrupt("shorter than the header");
  std::array<std::byte, file_header_bytes> hb;
  if (const int e = read_all(f.fd, hb); e != 0) return std::unexpected(sys_error("read", path, e));
  const auto h = decode_header(hb);
  if (!h) return corrupt("bad header (magic, version, class or header crc)");
  if (expect && h->key != *expect) return corrupt("header key differs from the file name");
  if (uint64_t(st.st_size) != file_header_bytes + h->payload_bytes)
    return corrupt("file size differs from header length");
  std::vector<std::byte> local;
  std::vector<std::byte>& body = payload ? *payload : local;
  body.resize(h->payload_bytes);
  if (const int e = read_all(f.fd, body); e != 0) return std::unexpected(sys_error("read", path, e));
  // Fault points (off unless a plan is installed): the read fails, or the bytes read are
  // damaged and the crc check below must catch it.
  if (runtime::inject(runtime::fault_point::storage_read)) return std::unexpected(sys_error("read", path, EIO));
  if (!body.empty() && runtime::inject(runtime::fault_point::storage_corrupt)) body[body.size() / 2] ^= std::byte{0x40};
  if (crc32c(body) != h->payload_crc) return corrupt("payload crc mismatch");
  if (file_bytes) *file_bytes = uint64_t(st.st_size);
  return *h;
}

}  // namespace

const char* to_string(store_errc e) {
  switch (e) {
    case store_errc::not_found: return "not_found";
    case store_errc::corrupt: return "corrupt";
    case store_errc::full: return "full";
    case store_errc::disk_full: return "disk_full";
    case store_errc::io: return "io";
    case store_errc::empty_chunk: return "empty_chunk";
    case store_errc::chunk_too_large: return "chunk_too_large";
    case store_errc::bad_config: return "bad_config";
  }
  return "unknown";
}

std::string to_string(const store_error& e) {
  return e.detail.empty() ? to_string(e.code) : std::string(to_string(e.code)) + ": " + e.detail;
}

lease& lease::operator=(lease&& o) noexcept {
  if (this != &o) {
    release();
    store_ = o.store_;
    key_ = o.key_;
    o.store_ = nullptr;
  }
  return *this;
}

void lease::release() {
  if (store_) store_->release_lease(key_);
  store_ = nullptr;
}

chunk_store::chunk_store(store_options opts) : opts_(std::move(opts)) {
  stats_.capacity_bytes = opts_.capacity_bytes;
}

chunk_store::~chunk_store() {
  std::lock_guard lk(mu_);
  SHOAL_ASSERT(leases_.empty());  // a lease outlived its store
}

store_result<std::unique_ptr<chunk_store>> chunk_store::open(store_options opts) {
  const auto bad = [](std::string why) {
    return std::unexpected(store_error{store_errc::bad_config, std::move(why)});
  };
  if (opts.root.empty()) return bad("root: empty");
  if (opts.capacity_bytes == 0) return bad("capacity_bytes: must be > 0");
  if (opts.max_chunk_bytes == 0 || opts.max_chunk_bytes > uint64_t(std::numeric_limits<int>::max()))
    return bad("max_chunk_bytes: must be in [1, 2^31)");
  if (!(opts.gc_low_watermark > 0 && opts.gc_low_watermark <= opts.gc_high_watermark &&
        opts.gc_high_watermark <= 1.0))
    return bad("gc watermarks: need 0 < low <= high <= 1");
  if (!opts.ttl.valid()) return bad("ttl: every class needs a ttl > 0");
  if (!opts.now_ms) return bad("now_ms: a clock is required");
  std::unique_ptr<chunk_store> s(new chunk_store(std::move(opts)));
  if (auto r = s->scan(); !r) return std::unexpected(r.error());
  return s;
}

store_result<void> chunk_store::scan() {
  const std::string& root = opts_.root;
  bool created = false;
  for (const std::string& d : {root, root + "/chunks"}) {
    if (const int e = make_dir(d, created); e != 0) return std::unexpected(sys_error("mkdir", d, e));
  }
  // Shard directories are created on first use (put), so scan only those that exist.
  std::vector<int> shards;
  {
    const std::string chunks = root + "/chunks";
    DIR* dp = ::opendir(chunks.c_str());
    if (!dp) return std::unexpected(sys_error("opendir", chunks, errno));
    while (const dirent* de = ::readdir(dp)) {
      const std::string_view n = de->d_name;
      const auto v = n.size() == 2 ? parse_shard(n) : -1;
      if (v >= 0) shards.push_back(v);
    }
    ::closedir(dp);
  }
  for (const int shard : shards) {
    const std::string dir = shard_dir(root, shard);
    DIR* dp = ::opendir(dir.c_str());
    if (!dp) return std::unexpected(sys_error("opendir", dir, errno));
    std::vector<std::string> names;
    while (const dirent* de = ::readdir(dp)) names.emplace_back(de->d_name);
    ::closedir(dp);
    for (const std::string& name : names) {
      const std::string path = dir + "/" + name;
      if (name.starts_with(temp_prefix)) {  // a write a crash interrupted: never published
        ::unlink(path.c_str());
        ++stats_.temp_removed;
        continue;
      }
      const auto key = parse_chunk_name(name);
      if (!key) continue;  // not ours ("." / ".." / foreign files): left alone
      uint64_t file_bytes = 0;
      const auto h = read_chunk_file(path, &*key, nullptr, &file_bytes);
      if (!h) {
        if (h.error().code != store_errc::corrupt) return std::unexpected(h.error());
        ::unlink(path.c_str());
        ++stats_.corrupt_removed;
        continue;
      }
      if (shard_of(*key) != shard) {  // valid bytes in the wrong shard: not ours to serve
        ++stats_.corrupt_removed;
        ::unlink(path.c_str());
        continue;
      }
      chunk_meta m{h->payload_bytes, h->cls, h->put_ms, h->put_ms, next_generation_++};
      insert_locked(*key, m);
      disk_bytes_ += file_bytes;
    }
  }
  if (opts_.sync == sync_policy::always) {
    for (const std::string& d : {root, root + "/chunks"}) {
      if (const int e = fsync_path(d, true); e != 0)
        return std::unexpected(sys_error("fsync", d, e));
    }
  }
  return {};
}

void chunk_store::insert_locked(const chunk_key& k, const chunk_meta& m) {
  const auto [it, inserted] = index_.emplace(k, m);
  SHOAL_ASSERT(inserted);
  lru_.insert(lru_of(k, m));
  usage_bytes_ += m.payload_bytes;
}

void chunk_store::drop_locked(const chunk_key& k) {
  const auto it = index_.find(k);
  SHOAL_ASSERT(it != index_.end());
  const std::string path = chunk_path(opts_.root, k);
  ::unlink(path.c_str());  // ENOENT is fine: the index entry is what serves
  SHOAL_ASSERT(lru_.erase(lru_of(k, it->second)) == 1);
  usage_bytes_ -= it->second.payload_bytes;
  disk_bytes_ -= std::min(disk_bytes_, file_header_bytes + it->second.payload_bytes);
  index_.erase(it);
}

bool chunk_store::expired_locked(const chunk_meta& m, int64_t now_ms) const {
  return opts_.ttl.expired(m.put_ms, m.cls, now_ms);
}

store_result<void> chunk_store::reserve_locked(uint64_t bytes, std::unique_lock<std::mutex>&) {
  const uint64_t cap = opts_.capacity_bytes;
  if (usage_bytes_ + reserved_bytes_ + bytes <= cap) return {};
  sweep_locked(now());  // expired chunks go first: they are dead weight
  if (usage_bytes_ + reserved_bytes_ + bytes > cap && reserved_bytes_ + bytes <= cap) {
    // Make room down to the low watermark (not just this chunk) so puts don't evict one by one.
    const uint64_t room = cap - reserved_bytes_ - bytes;
    const uint64_t low = uint64_t(opts_.gc_low_watermark * double(cap));
    ++stats_.gc_runs;
    evict_locked(std::min(room, low));
  }
  if (usage_bytes_ + reserved_bytes_ + bytes <= cap) return {};
  return std::unexpected(store_error{
      store_errc::full, "capacity " + std::to_string(cap) + " bytes, used " +
                            std::to_string(usage_bytes_ + reserved_bytes_) + ", need " +
                            std::to_string(bytes) + " (the rest is leased)"});
}

store_result<void> chunk_store::write_temp(const std::string& tmp, std::span<const std::byte> header,
                                           std::span<const std::byte> payload) {
  constexpr int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  fd_guard f{::open(tmp.c_str(), flags, 0644)};
  if (f.fd < 0 && errno == ENOENT) {  // first chunk of this shard: create its directory
    const std::string dir = tmp.substr(0, tmp.rfind('/'));
    bool created = false;
    if (const int e = make_dir(dir, created); e != 0)
      return std::unexpected(sys_error("mkdir", dir, e));
    if (created && opts_.sync == sync_policy::always) {
      const std::string parent = opts_.root + "/chunks";
      if (const int e = fsync_path(parent, true); e != 0)
        return std::unexpected(sys_error("fsync", parent, e));
    }
    f.fd = ::open(tmp.c_str(), flags, 0644);
  }
  if (f.fd < 0) return std::unexpected(sys_error("open", tmp, errno));
  // Simulated disk: how many of this file's bytes still fit (checked against the bytes on disk).
  uint64_t allowed = std::numeric_limits<uint64_t>::max();
  {
    std::lock_guard lk(mu_);
    if (opts_.simulated_disk_bytes != 0) {
      const uint64_t total = header.size() + payload.size();
      const uint64_t used = disk_bytes_ - total;  // disk_bytes_ already counts this file
      allowed = opts_.simulated_disk_bytes > used ? opts_.simulated_disk_bytes - used : 0;
    }
  }
  // Fault points (off unless a plan is installed): no space, or an I/O error, on this write.
  if (runtime::inject(runtime::fault_point::disk_full)) return std::unexpected(sys_error("write", tmp, ENOSPC));
  if (runtime::inject(runtime::fault_point::storage_write)) return std::unexpected(sys_error("write", tmp, EIO));
  for (const auto part : {header, payload}) {
    const auto n = std::min<uint64_t>(part.size(), allowed);
    if (const int e = write_all(f.fd, part.first(n)); e != 0)
      return std::unexpected(sys_error("write", tmp, e));
    allowed -= n;
    if (n < part.size()) return std::unexpected(sys_error("write", tmp, ENOSPC));
  }
  if (opts_.sync == sync_policy::always && ::fsync(f.fd) != 0)
    return std::unexpected(sys_error("fsync", tmp, errno));
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) return std::unexpected(sys_error("close", tmp, errno));
  return {};
}

store_result<void> chunk_store::put(const chunk_key& key, std::span<const std::byte> bytes,
                                    traffic_class cls) {
  const auto started = std::chrono::steady_clock::now();
  if (bytes.empty()) return std::unexpected(store_error{store_errc::empty_chunk, to_string(key)});
  if (bytes.size() > opts_.max_chunk_bytes)
    return std::unexpected(store_error{
        store_errc::chunk_too_large, to_string(key) + ": " + std::to_string(bytes.size()) +
                                         " bytes > max_chunk_bytes " +
                                         std::to_string(opts_.max_chunk_bytes)});
  const uint64_t file_bytes = file_header_bytes + bytes.size();
  const std::string final_path = chunk_path(opts_.root, key);
  std::string tmp;
  int64_t put_ms = 0;
  std::unique_lock lk(mu_);
  if (auto r = reserve_locked(bytes.size(), lk); !r) {
    ++stats_.put_failures;
    return r;
  }
  reserved_bytes_ += bytes.size();
  disk_bytes_ += file_bytes;
  ++leases_[key];  // GC leaves the key's current version alone while we replace it
  put_ms = now();
  tmp = shard_dir(opts_.root, shard_of(key)) + "/" + std::string(temp_prefix) + to_string(key) +
        "." + std::to_string(::getpid()) + "." + std::to_string(temp_seq_++);
  lk.unlock();

  const chunk_header h{key, cls, put_ms, bytes.size(), crc32c(bytes)};
  const auto hb = encode_header(h);
  auto w = write_temp(tmp, hb, bytes);

  lk.lock();
  if (w && ::rename(tmp.c_str(), final_path.c_str()) != 0)
    w = std::unexpected(sys_error("rename", tmp, errno));
  reserved_bytes_ -= bytes.size();
  if (!w) {
    ::unlink(tmp.c_str());
    disk_bytes_ -= file_bytes;
    ++stats_.put_failures;
    unlease_locked(key);
    return w;
  }
  if (const auto old = index_.find(key); old != index_.end()) {
    SHOAL_ASSERT(lru_.erase(lru_of(key, old->second)) == 1);
    usage_bytes_ -= old->second.payload_bytes;
    disk_bytes_ -= file_header_bytes + old->second.payload_bytes;
    index_.erase(old);
  }
  insert_locked(key, chunk_meta{bytes.size(), cls, put_ms, put_ms, next_generation_++});
  ++stats_.puts;
  unlease_locked(key);
  lk.unlock();

  if (opts_.sync == sync_policy::always) {
    const std::string dir = shard_dir(opts_.root, shard_of(key));
    if (const int e = fsync_path(dir, true); e != 0)  // visible but maybe not durable: say so
      return std::unexpected(sys_error("fsync", dir, e));
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::lock_guard lk2(mu_);
  stats_.put_seconds += took;
  return {};
}

store_result<std::vector<std::byte>> chunk_store::get(const chunk_key& key) {
  const auto started = std::chrono::steady_clock::now();
  uint64_t generation = 0;
  {
    std::lock_guard lk(mu_);
    ++stats_.gets;
    const auto it = index_.find(key);
    if (it == index_.end() || expired_locked(it->second, now()))
      return std::unexpected(store_error{store_errc::not_found, to_string(key)});
    generation = it->second.generation;
    ++leases_[key];
  }
  std::vector<std::byte> payload;
  const std::string path = chunk_path(opts_.root, key);
  const auto h = read_chunk_file(path, &key, &payload, nullptr);

  std::lock_guard lk(mu_);
  unlease_locked(key);
  const auto it = index_.find(key);
  if (!h) {
    // Corruption turns into an erasure: the file goes (unless a newer put already replaced it).
    if (h.error().code == store_errc::corrupt && it != index_.end() &&
        it->second.generation == generation) {
      drop_locked(key);
      ++stats_.corrupt_removed;
    }
    return std::unexpected(h.error());
  }
  if (it != index_.end()) {
    SHOAL_ASSERT(lru_.erase(lru_of(key, it->second)) == 1);
    it->second.last_read_ms = std::max(it->second.last_read_ms, now());
    lru_.insert(lru_of(key, it->second));
  }
  ++stats_.get_hits;
  stats_.get_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return payload;
}

std::vector<bool> chunk_store::exists(std::span<const chunk_key> keys) const {
  std::lock_guard lk(mu_);
  const int64_t t = now();
  std::vector<bool> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto it = index_.find(keys[i]);
    out[i] = it != index_.end() && !expired_locked(it->second, t);
  }
  return out;
}

store_result<void> chunk_store::remove(const chunk_key& key) {
  std::lock_guard lk(mu_);
  if (!index_.contains(key))
    return std::unexpected(store_error{store_errc::not_found, to_string(key)});
  drop_locked(key);  // removal is not fsynced: a chunk that reappears after a crash is still valid
  ++stats_.removes;
  return {};
}

std::optional<chunk_meta> chunk_store::meta(const chunk_key& key) const {
  std::lock_guard lk(mu_);
  const auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

lease chunk_store::acquire(const chunk_key& key) {
  std::lock_guard lk(mu_);
  ++leases_[key];
  return lease(this, key);
}

void chunk_store::release_lease(const chunk_key& key) {
  std::lock_guard lk(mu_);
  unlease_locked(key);
}

void chunk_store::unlease_locked(const chunk_key& key) {
  const auto it = leases_.find(key);
  SHOAL_ASSERT(it != leases_.end() && it->second > 0);
  if (--it->second == 0) leases_.erase(it);
}

uint64_t chunk_store::usage_bytes() const {
  std::lock_guard lk(mu_);
  return usage_bytes_;
}

store_stats chunk_store::stats() const {
  std::lock_guard lk(mu_);
  store_stats s = stats_;
  s.chunks = index_.size();
  s.usage_bytes = usage_bytes_;
  s.capacity_bytes = opts_.capacity_bytes;
  return s;
}

void chunk_store::set_simulated_disk_bytes(uint64_t bytes) {
  std::lock_guard lk(mu_);
  opts_.simulated_disk_bytes = bytes;
}

void chunk_store::check_invariants() const {
  std::lock_guard lk(mu_);
  SHOAL_ASSERT(index_.size() == lru_.size());
  uint64_t usage = 0;
  for (const auto& [k, m] : index_) {
    SHOAL_ASSERT(lru_.contains(lru_of(k, m)));
    SHOAL_ASSERT(m.payload_bytes > 0 && m.last_read_ms >= m.put_ms);
    usage += m.payload_bytes;
  }
  SHOAL_ASSERT(usage == usage_bytes_);
  SHOAL_ASSERT(disk_bytes_ >= usage_bytes_ + file_header_bytes * index_.size());
  for (const auto& [k, n] : leases_) SHOAL_ASSERT(n > 0);
}

}  // namespace shoal::storage
