// Unmodified official clients against the real gateway: the openai npm package runs
// tests/clients/openai_client_test.mjs (structured output, tool calling whole and streamed,
// a 400 surfacing as the client's error) against an in-process gateway over loopback HTTP.
// It runs where node and tests/clients/node_modules (`npm ci --prefix tests/clients`, which
// scripts/setup.sh tries) are present, and says so when they are not.
#include <doctest/doctest.h>

#include "tests/actors/gateway_harness.hpp"
#include "tests/support/process.hpp"
#include "tests/support/skip.hpp"

using namespace shoal;
using namespace shoal::test::gateway_harness;
namespace fs = std::filesystem;

namespace {

std::optional<std::string> find_node() {
  for (const char* p : {"/usr/bin/node", "/usr/local/bin/node", "/usr/bin/nodejs"})
    if (fs::exists(p)) return std::string(p);
  return std::nullopt;
}

}  // namespace

TEST_CASE("official openai npm client: structured output and tool calls work unmodified") {
  const fs::path dir = fs::path(SHOAL_SOURCE_DIR) / "tests" / "clients";
  auto node = find_node();
  if (!node || !fs::exists(dir / "node_modules" / "openai" / "package.json"))
    SHOAL_SKIP("needs node and the openai package (npm ci --prefix tests/clients)");
  cluster c(1);
  uint16_t port = c.start_gateway(cluster::default_gateway());
  test::temp_dir tmp;
  test::child_process p({*node, (dir / "openai_client_test.mjs").string(),
                         "http://127.0.0.1:" + std::to_string(port) + "/v1", "tiny"},
                        tmp.path / "out", tmp.path / "err");
  auto rc = p.wait_exit(std::chrono::seconds(300));
  const std::string out = test::read_text(tmp.path / "out"), err = test::read_text(tmp.path / "err");
  REQUIRE_MESSAGE(rc.has_value(), "the client did not finish within 300 s");
  CHECK_MESSAGE(*rc == 0, "stdout:\n" << out << "\nstderr:\n" << err);
  MESSAGE(out);
}
