// Which variant of the row kernels runs: CPUID, SHOAL_CPU_ISA, and the active table.
#include "kernels/cpu/isa.hpp"

#include <atomic>
#include <cstdlib>

#include "kernels/cpu/variants.hpp"

namespace shoal::kernels {
namespace {

std::atomic<const detail::row_kernels*> active{nullptr};
std::atomic<int> active_id{-1};

const detail::row_kernels& table(cpu_isa isa) {
  return isa == cpu_isa::avx512 ? detail::avx512_kernels() : detail::avx2_kernels();
}

std::expected<cpu_isa, std::string> from_env() {
  const char* v = std::getenv("SHOAL_CPU_ISA");
  const cpu_isa best = supported_isas().back();
  if (!v || !*v) return best;
  const std::string_view name(v);
  for (cpu_isa isa : {cpu_isa::avx2, cpu_isa::avx512}) {
    if (name != to_string(isa)) continue;
    if (!cpu_supports(isa))
      return std::unexpected("SHOAL_CPU_ISA=" + std::string(name) + " needs " +
                             (isa == cpu_isa::avx512 ? "AVX-512 F/BW/VL/DQ" : "AVX2 and FMA") +
                             "; this CPU runs " + std::string(to_string(best)));
    return isa;
  }
  return std::unexpected("SHOAL_CPU_ISA=" + std::string(name) + " is not a kernel variant (avx2, avx512)");
}

}  // namespace

std::string_view to_string(cpu_isa isa) { return isa == cpu_isa::avx512 ? "avx512" : "avx2"; }

bool cpu_supports(cpu_isa isa) {
  if (isa == cpu_isa::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

std::vector<cpu_isa> supported_isas() {
  std::vector<cpu_isa> out{cpu_isa::avx2};  // the build's baseline: the binary needs it anyway
  if (cpu_supports(cpu_isa::avx512)) out.push_back(cpu_isa::avx512);
  return out;
}

bool set_isa(cpu_isa isa) {
  if (!cpu_supports(isa)) return false;
  active_id = static_cast<int>(isa);
  active = &table(isa);
  return true;
}

cpu_isa active_isa() {
  (void)detail::active_kernels();
  return static_cast<cpu_isa>(active_id.load());
}

std::expected<cpu_isa, std::string> select_isa_from_env() {
  auto isa = from_env();
  if (isa) set_isa(*isa);
  return isa;
}

std::string isa_summary() {
  const char* v = std::getenv("SHOAL_CPU_ISA");
  return std::string(to_string(active_isa())) + " (best " + std::string(to_string(supported_isas().back())) +
         ", SHOAL_CPU_ISA" + (v && *v ? "=" + std::string(v) : std::string(" unset")) + ")";
}

namespace detail {

const row_kernels& active_kernels() {
  const row_kernels* k = active.load(std::memory_order_acquire);
  if (k) return *k;
  auto isa = from_env();
  set_isa(isa ? *isa : supported_isas().back());
  return *active.load(std::memory_order_acquire);
}

}  // namespace detail
}  // namespace shoal::kernels
