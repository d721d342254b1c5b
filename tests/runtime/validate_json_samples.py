#!/usr/bin/env python3
"""Validates structured-output samples with the jsonschema package (Debian python3-jsonschema),
an implementation independent of shoal's grammar engine.

usage: validate_json_samples.py SCHEMAS.json SAMPLES.jsonl
SCHEMAS.json: a JSON array of schemas; SAMPLES.jsonl: {"schema": index, "text": output} per line.
Prints one line per invalid sample and a summary; exits 1 if any sample is invalid."""
import json
import sys

import jsonschema


def no_constants(name):
    raise ValueError(f"{name} is not JSON")


def main():
    sys.setrecursionlimit(20000)  # deeply nested samples of recursive schemas
    schemas = json.load(open(sys.argv[1], encoding="utf-8"))
    bad = total = 0
    used = set()
    for line in open(sys.argv[2], encoding="utf-8"):
        rec = json.loads(line)
        total += 1
        used.add(rec["schema"])
        schema = schemas[rec["schema"]]
        try:
            value = json.loads(rec["text"], parse_constant=no_constants)
            jsonschema.Draft202012Validator(schema).validate(value)
        except (ValueError, jsonschema.ValidationError) as e:
            bad += 1
            print(f"schema {rec['schema']}: {rec['text']!r}: {str(e).splitlines()[0]}")
    print(f"{total - bad} of {total} samples valid over {len(used)} schemas")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
