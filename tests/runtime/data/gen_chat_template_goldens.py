#!/usr/bin/env python3
"""Regenerates chat_template_goldens.json: renders of the DeepSeek-V3 chat template and of the
fallback template of model/generate.cpp with Python Jinja2 (3.x), set up as transformers'
apply_chat_template does (sandboxed, trim_blocks, lstrip_blocks, raise_exception). The C++ test
(tests/runtime/chat_template_test.cpp) compares runtime/chat_template against this file, so
Python is needed only to regenerate it:  python3 gen_chat_template_goldens.py [SHARED_DIR]
"""
import json
import os
import re
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

here = os.path.dirname(os.path.abspath(__file__))
source_dir = os.path.normpath(os.path.join(here, "..", "..", ".."))
shared_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(source_dir, "..", "shared")


def fallback_template():
    """The `chat_template` C string of model/generate.cpp (adjacent literals joined)."""
    text = open(os.path.join(source_dir, "model", "generate.cpp"), encoding="utf-8").read()
    body = re.search(r"const char\* chat_template =(.*?);\n", text, re.S).group(1)
    return "".join(json.loads('"' + s + '"') for s in re.findall(r'"((?:[^"\\]|\\.)*)"', body))


def raise_exception(message):
    raise RuntimeError(message)


SYS = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [SYS, {"role": "user", "content": "What is 2+2?"}],
    [SYS, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [{"role": "system", "content": "First rule."}, {"role": "system", "content": "Second rule."},
     {"role": "user", "content": "Go"}],
    [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
     {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}],
    [SYS, {"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None},
     {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "assistant", "content": "It is 21 C."}],
    [{"role": "user", "content": "Run both"}, {"role": "tool", "content": "out-1"},
     {"role": "tool", "content": "out-2"}],
    [{"role": "user", "content": "Ünïcödé ✓ 你好 🙂 — «quotes» 'single' \"double\""},
     {"role": "assistant", "content": "Ответ: ok"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    [{"role": "system", "content": "  padded  \n"}, {"role": "user", "content": "line1\nline2\n\n  indented"}],
    [{"role": "user", "content": "{{ not a tag }} {% neither %} <｜User｜>"}],
    [],
    [{"role": "assistant", "content": "Assistant speaks first."}, {"role": "user", "content": "ok"}],
    [{"role": "user", "content": None}],
]

# Small templates covering the rest of the subset, rendered with CONVERSATIONS[2]; `options`
# switches trim_blocks/lstrip_blocks (default: both on, as transformers).
SNIPPETS = [
    "{% for m in messages %}{{ loop.index0 }}:{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
    "{% for m in messages %}{% if loop.first %}[{% endif %}{{ loop.index }}/{{ loop.length }}{% if loop.last %}]{% endif %}{% endfor %}",
    "{{ messages|length }} {{ '  x  '|trim }} {{ 'abc'|length }} {{ '你好'|length }} {{ 'xxaxx'|trim('x') }}",
    "{{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 2 in [1, 2, 3] }} {{ 'role' in messages[0] }}",
    "{{ true }} {{ false }} {{ none }} {{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 1.5 * 2 }}"
    " {{ 1 / 4 }} {{ 10 / 5 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 123456.789 }} {{ 2.5e15 }} {{ 1e16 }}",
    "{{ 'x' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1, 'a', none, true, \"it's\", 1.5] }} {{ messages[0] }}",
    "A  \n  {%- if true -%}  \n  B  \n  {%- endif -%}  \nC",
    "line1\n  {% if true %}\n  body\n  {% endif %}\nline2\n{# comment #}\nend\n   {# indented comment #}\nx",
    "{{- ' lead' -}}   {{ 'x' }}  {{- 'y' }}  {{ 'z' -}}\n\n end",
    "{{ 'tab\\tq\\'d\\\\ \\u00e9 \\x41 \\n' }}{{ \"dq\\\"\" }}{{ 'adj' \"acent\" }}",
    "{{ messages[0]['content'] if messages else 'empty' }}|{{ 'yes' if false }}|{{ messages[-1].role }}|{{ messages[99] is defined }}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set inner = 1 %}{% endfor %}{{ ns.n }} {{ inner is defined }}",
    "{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}",
    "{% for c in 'héllo' %}{{ c }}.{% endfor %}{% for x in [] %}no{% else %}empty{% endfor %}",
    "{{ messages[0].content.strip().startswith('You') }} {{ '  a '.rstrip() }}| {{ 'ABC'|lower }}{{ 'abc'.upper() }} {{ 'abc'.endswith('bc') }}",
    "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ 3 >= 4 }} {{ none is none }} {{ undefined_var is not defined }} {{ [1,2] == [1,2] }}",
    "{{ (1 + 2) * 3 }} {{ not true or true }} {{ 0 or 'fallback' }} {{ 'v' and 5 }} {{ -(3) }} {{ 5 - 2 - 1 }} {{ 2 - -1 }}",
    "{% if add_generation_prompt %}{% set add_generation_prompt = false %}{% endif %}{{ add_generation_prompt }}",
    "{{ messages[0]['missing'] }}|{{ none.attr is defined }}|{{ messages[0].role is string }}|{{ 3 is number }}",
    "  {%+ if true %}x{% endif %}\n  {% if true %}y{% endif %}",
    "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n",
    "{% for m in messages %}{% for c in ['p', 'q'] %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}",
    "{% if messages[0].role == 'user' %}u{% elif messages[0].role == 'system' %}s{% else %}o{% endif %}",
    "{{ raise_exception('Conversation roles must alternate') }}",
    "{{ 'a' + none }}",
    {"template": "  {% if true %}\n x\n  {% endif %}\n {# c #}\n", "options": {"trim_blocks": False, "lstrip_blocks": False}},
    {"template": "  {% if true %}\n x\n  {% endif %}\n", "options": {"trim_blocks": True, "lstrip_blocks": False}},
    {"template": "  {% if true %}\n x\n  {% endif %}\n", "options": {"trim_blocks": False, "lstrip_blocks": True}},
]


def render_snippets():
    out = []
    for s in SNIPPETS:
        s = s if isinstance(s, dict) else {"template": s, "options": {"trim_blocks": True, "lstrip_blocks": True}}
        env = ImmutableSandboxedEnvironment(**s["options"])
        env.globals["raise_exception"] = raise_exception
        case = dict(s)
        try:
            case["expected"] = env.from_string(s["template"]).render(
                messages=CONVERSATIONS[2], add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
        except Exception as e:
            case["expected"] = None
            case["error"] = type(e).__name__
        out.append(case)
    return out


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    cfg_path = os.path.join(shared_dir, "tokenizers", "deepseek-v3", "tokenizer_config.json")
    cfg = json.load(open(cfg_path, encoding="utf-8"))
    templates = [
        {"name": "deepseek-v3", "template": cfg["chat_template"], "bos_token": cfg["bos_token"]["content"],
         "eos_token": cfg["eos_token"]["content"]},
        {"name": "generate-fallback", "template": fallback_template(), "bos_token": "<｜begin▁of▁sentence｜>",
         "eos_token": "<｜end▁of▁sentence｜>"},
    ]
    for t in templates:
        compiled = env.from_string(t["template"])
        cases = []
        for messages in CONVERSATIONS:
            for agp in (False, True):
                case = {"messages": messages, "add_generation_prompt": agp}
                try:
                    case["expected"] = compiled.render(messages=messages, add_generation_prompt=agp,
                                                       bos_token=t["bos_token"], eos_token=t["eos_token"])
                except Exception as e:  # recorded: the C++ renderer must fail too
                    case["expected"] = None
                    case["error"] = type(e).__name__
                cases.append(case)
        t["cases"] = cases
    snippets = render_snippets()
    out = os.path.join(here, "chat_template_goldens.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"templates": templates, "snippets": snippets}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {out}: {sum(len(t['cases']) for t in templates)} conversations, {len(snippets)} snippets")


if __name__ == "__main__":
    main()
