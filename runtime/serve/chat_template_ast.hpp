// Internal to chat_template: the values a template computes with and the tree the parser
// (chat_template.cpp) builds and the evaluator (chat_template_eval.cpp) walks. Values follow
// Python's semantics as Jinja2 exposes them (undefined vs none, bool as int, code-point
// lengths); lists and maps are shared immutable, a namespace() is shared and mutable.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

// `SHOAL_TEMPLATE_TRY(x, f())`: binds x to f()'s value, or returns its error (both .cpp files
// return std::expected<..., std::string> from every fallible step).
#define SHOAL_TEMPLATE_TRY(var, call)                                  \
  auto var##_result = (call);                                          \
  if (!var##_result) return std::unexpected(std::move(var##_result.error())); \
  auto var = std::move(*var##_result)
// `SHOAL_TEMPLATE_CHECK(f())` for steps returning std::expected<void, std::string>.
#define SHOAL_TEMPLATE_CHECK(call)                              \
  if (auto check_result = (call); !check_result) return std::unexpected(std::move(check_result.error()))

namespace shoal::runtime::detail {

struct value;
using value_list = std::vector<value>;
using value_map = std::vector<std::pair<std::string, value>>;  // insertion order, like dict
struct namespace_object;

struct undefined_t {};
struct none_t {};

struct value {
  std::variant<undefined_t, none_t, bool, int64_t, double, std::string,
               std::shared_ptr<const value_list>, std::shared_ptr<const value_map>,
               std::shared_ptr<namespace_object>>
      v;
};

struct namespace_object {
  value_map attrs;
};

enum class expr_kind : uint8_t {
  literal,    // lit
  name,       // text = variable
  list,       // args = items
  attr,       // args[0].text
  subscript,  // args[0][args[1]]
  call,       // args[0](args[1..]); kwarg_names for the trailing keyword arguments
  filter,     // args[0] | text(args[1..])
  test,       // args[0] is [not] text
  unary,      // text in {"not", "-", "+"}, args[0]
  binary,     // args[0] text args[1]; text in {+,-,*,/,//,%,~,==,!=,<,<=,>,>=,in,not in}
  logic,      // args[0] text args[1]; text in {and, or} (short-circuit)
  cond,       // args[0] if args[1] else args[2] (args[2] absent: undefined)
};

struct expr {
  expr_kind kind = expr_kind::literal;
  std::string text;
  value lit;
  std::vector<expr> args;
  std::vector<std::string> kwarg_names;  // call: names of the last kwarg_names.size() args
  bool negated = false;                  // test: `is not`
  size_t offset = 0;                     // in the normalised source
  uint32_t height = 1;                   // of this subtree; the parser bounds it (eval recursion)
};

enum class stmt_kind : uint8_t { text, output, if_, for_, set };

struct stmt {
  stmt_kind kind = stmt_kind::text;
  std::string text;       // text: the data; for_: loop variable; set: variable
  std::string attr;       // set: namespace attribute (`set ns.attr = ...`), else empty
  std::vector<expr> exprs;  // output/set: [value]; if_: one condition per branch; for_: [iterable]
  std::vector<std::vector<stmt>> bodies;  // if_: branches (+ else); for_: [body, else]
  size_t offset = 0;
};

// What the evaluator implements; the parser rejects other names, as Jinja does at compile time.
inline constexpr std::array<std::string_view, 6> filter_names = {"trim", "length", "count", "string",
                                                                 "lower", "upper"};
inline constexpr std::array<std::string_view, 11> test_names = {
    "defined", "undefined", "none", "string", "number", "boolean",
    "mapping", "sequence", "iterable", "true", "false"};

struct template_program {
  std::vector<stmt> body;
};

}  // namespace shoal::runtime::detail
