// The CPU instruction sets the kernels are compiled for, and the one they run with. Each
// variant is built with its own target flags (kernels/CMakeLists.txt) and chosen when the
// process starts: the best this CPU has, or SHOAL_CPU_ISA (avx2, avx512) to force one below
// it, so every variant up to the machine's best is tested on the same machine.
#pragma once

#include <expected>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::kernels {

// avx2: AVX2 + FMA + F16C (x86-64-v3, the build's baseline). avx512: AVX-512 F, BW, VL, DQ.
enum class cpu_isa { avx2, avx512 };

std::string_view to_string(cpu_isa isa);
// Whether this CPU (CPUID) runs the variant.
bool cpu_supports(cpu_isa isa);
// Every variant this CPU runs, lowest first; the last is the best.
std::vector<cpu_isa> supported_isas();

// The variant the kernels use now. On first use: SHOAL_CPU_ISA when it names a variant
// this CPU runs, else the best (a bad value is reported by select_isa_from_env()).
cpu_isa active_isa();
// Switches the kernels to `isa` (tests); false, and nothing changes, if the CPU lacks it.
bool set_isa(cpu_isa isa);
// Applies SHOAL_CPU_ISA (unset or empty: the best). The error names the value and what
// this CPU offers: "SHOAL_CPU_ISA=avx512 needs AVX-512 F/BW/VL/DQ; this CPU runs avx2".
std::expected<cpu_isa, std::string> select_isa_from_env();
// One line for start-up logs and bench records: "avx2 (best avx2, SHOAL_CPU_ISA unset)".
std::string isa_summary();

}  // namespace shoal::kernels
