// The SWA slot fetch vs bounded replay figures (bench_swa.cpp), shared by `shoal bench swa`
// and `shoal bench disagg`: prints them and returns them as JSON fields.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace shoal::tools {

nlohmann::json swa_fetch_vs_replay(const std::string& provider, const std::string& preset, int fetches, int turns);

}  // namespace shoal::tools
