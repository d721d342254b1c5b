#include "runtime/placement/regroup.hpp"

#include <algorithm>
#include <optional>

namespace shoal::runtime {

namespace {

bool contains(const std::vector<int32_t>& sorted, int32_t e) { return std::binary_search(sorted.begin(), sorted.end(), e); }

void insert_sorted(std::vector<int32_t>& sorted, int32_t e) { sorted.insert(std::lower_bound(sorted.begin(), sorted.end(), e), e); }

// Strictly ascending experts in [0, logical), or the reason not.
std::optional<std::string> bad_list(const std::vector<int32_t>& list, int64_t logical) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] < 0 || list[i] >= logical)
      return "expert " + std::to_string(list[i]) + " outside [0, " + std::to_string(logical) + ")";
    if (i > 0 && list[i] <= list[i - 1]) return std::string("experts not strictly ascending");
  }
  return std::nullopt;
}

std::optional<std::string> check_view(const group_view& v, int64_t slots, int64_t logical, int32_t ranks) {
  if (v.holds.size() != static_cast<size_t>(slots))
    return "holds has " + std::to_string(v.holds.size()) + " slots, expected " + std::to_string(slots);
  for (int64_t s = 0; s < slots; ++s)
    if (auto bad = bad_list(v.holds[s], logical)) return "holds of slot " + std::to_string(s) + ": " + *bad;
  if (!v.has_basis) return std::nullopt;
  if (v.known.size() != static_cast<size_t>(ranks) || v.lists.size() != static_cast<size_t>(slots * ranks))
    return "basis covers " + std::to_string(v.known.size()) + " ranks and " + std::to_string(v.lists.size()) +
           " lists, expected " + std::to_string(ranks) + " and " + std::to_string(slots * ranks);
  for (int64_t s = 0; s < slots; ++s)
    for (int32_t r = 0; r < ranks; ++r) {
      const auto& list = v.lists[s * ranks + r];
      if (!v.known[r] && !list.empty())
        return "basis slot " + std::to_string(s) + " places experts on rank " + std::to_string(r) + ", which it does not know";
      if (auto bad = bad_list(list, logical))
        return "basis slot " + std::to_string(s) + " rank " + std::to_string(r) + ": " + *bad;
    }
  return std::nullopt;
}

// Fills slot `s` of `lists` (the basis's, unknown ranks empty): orphans, then the joiners' shares.
void regroup_slot(int64_t s, int64_t logical, int32_t ranks, const std::vector<group_view>& views,
                  const std::vector<uint8_t>& known, std::vector<std::vector<int32_t>>& lists, regroup_result& out) {
  auto list = [&](int32_t r) -> std::vector<int32_t>& { return lists[s * ranks + r]; };
  auto holds = [&](int32_t r, int32_t e) { return contains(views[r].holds[s], e); };
  std::vector<int32_t> copies(static_cast<size_t>(logical), 0);
  for (int32_t r = 0; r < ranks; ++r)
    for (int32_t e : list(r)) ++copies[e];
  for (int32_t e = 0; e < logical; ++e) {
    if (copies[e] > 0) continue;
    ++out.orphans;
    int32_t best = -1;  // a holder computing the fewest; without one, any rank computing the fewest
    for (int pass = 0; pass < 2 && best < 0; ++pass)
      for (int32_t r = 0; r < ranks; ++r)
        if ((pass == 1 || holds(r, e)) && (best < 0 || list(r).size() < list(best).size())) best = r;
    insert_sorted(list(best), e);
  }
  size_t total = 0;
  for (int32_t r = 0; r < ranks; ++r) total += list(r).size();
  const size_t share = total / static_cast<size_t>(ranks);
  for (int32_t j = 0; j < ranks; ++j) {
    if (known[j]) continue;
    while (list(j).size() < share) {
      // From a rank above the share: an expert j's process holds first, then the fullest
      // donor, the lowest rank, the lowest expert.
      int32_t donor = -1, pick = -1;
      bool pick_held = false;
      for (int32_t d = 0; d < ranks; ++d) {
        if (d == j || list(d).size() <= share) continue;
        for (int32_t e : list(d)) {
          if (contains(list(j), e)) continue;
          const bool held = holds(j, e);
          bool better = donor < 0 || (held && !pick_held) ||
                        (held == pick_held && list(d).size() > list(donor).size());
          if (better) donor = d, pick = e, pick_held = held;
        }
      }
      if (donor < 0) break;
      list(donor).erase(std::find(list(donor).begin(), list(donor).end(), pick));
      insert_sorted(list(j), pick);
      ++out.moved_to_new;
    }
  }
}

}  // namespace

group_view fresh_view(int64_t slots, std::vector<std::vector<int32_t>> holds) {
  group_view v;
  v.holds = std::move(holds);
  v.holds.resize(static_cast<size_t>(slots));
  return v;
}

group_view view_of(const ep_placement& placement, const std::vector<int32_t>& moved, int32_t ranks) {
  group_view v;
  v.has_basis = true;
  v.epoch = placement.epoch();
  v.known.assign(static_cast<size_t>(ranks), 0);
  v.lists.assign(static_cast<size_t>(placement.slots() * ranks), {});
  v.holds.resize(static_cast<size_t>(placement.slots()));
  for (int32_t o = 0; o < placement.ranks() && o < static_cast<int32_t>(moved.size()); ++o) {
    const int32_t n = moved[o];
    if (n < 0 || n >= ranks) continue;
    v.known[n] = 1;
    for (int64_t s = 0; s < placement.slots(); ++s) {
      auto e = placement.experts_of(s, o);
      v.lists[s * ranks + n].assign(e.begin(), e.end());
    }
  }
  return v;
}

group_view renumber(const group_view& v, int64_t slots, const std::vector<int32_t>& moved, int32_t ranks) {
  if (!v.has_basis) return fresh_view(slots);
  const auto before = static_cast<int32_t>(v.known.size());
  group_view out;
  out.has_basis = true;
  out.epoch = v.epoch;
  out.known.assign(static_cast<size_t>(ranks), 0);
  out.lists.assign(static_cast<size_t>(slots * ranks), {});
  out.holds.resize(static_cast<size_t>(slots));
  for (int32_t o = 0; o < before && o < static_cast<int32_t>(moved.size()); ++o) {
    const int32_t n = moved[o];
    if (n < 0 || n >= ranks || !v.known[o]) continue;
    out.known[n] = 1;
    for (int64_t s = 0; s < slots; ++s) out.lists[s * ranks + n] = v.lists[s * before + o];
  }
  return out;
}

std::expected<regroup_result, std::string> regroup_placement(int64_t slots, int64_t logical, int32_t ranks,
                                                             const std::vector<group_view>& views) {
  if (slots < 0 || logical < 1 || ranks < 1 || views.size() != static_cast<size_t>(ranks))
    return std::unexpected("regroup: " + std::to_string(views.size()) + " views for a group of " +
                           std::to_string(ranks) + " ranks");
  int32_t basis = -1;
  for (int32_t r = 0; r < ranks; ++r) {
    if (auto bad = check_view(views[r], slots, logical, ranks)) return std::unexpected("rank " + std::to_string(r) + "'s view: " + *bad);
    if (views[r].has_basis && (basis < 0 || views[r].epoch > views[basis].epoch)) basis = r;
  }
  if (basis < 0) return regroup_result{ep_placement::contiguous(slots, logical, ranks), -1, 0, 0};
  regroup_result out{ep_placement::contiguous(slots, logical, ranks), basis, 0, 0};
  std::vector<std::vector<int32_t>> lists = views[basis].lists;
  for (int64_t s = 0; s < slots; ++s) regroup_slot(s, logical, ranks, views, views[basis].known, lists, out);
  auto placed = ep_placement::from_lists(slots, logical, ranks, views[basis].epoch + 1, std::move(lists));
  if (!placed) return std::unexpected("regroup: " + placed.error());
  out.placement = std::move(*placed);
  return out;
}

}  // namespace shoal::runtime
