#!/usr/bin/env python3
"""check-compose.py SCHEMA [COMPOSE] -- validate a compose file without Docker.

What `docker compose config` would do first, for machines with no compose
plugin: parse the YAML (anchors and << merge keys), interpolate ${VAR},
${VAR:-default}, ${VAR-default}, ${VAR:?error} and $$ from the environment, validate the
result against the Compose Specification's JSON schema (schema/compose-spec.json
of the compose-spec repository, passed as SCHEMA), and check references the
schema cannot: every network and named volume a service uses is declared,
every depends_on names a service. Prints the interpolated file as JSON with
-v. Exit 0 when valid. Needs PyYAML and jsonschema.
"""
import json
import os
import re
import sys

import jsonschema
import yaml

VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(v):
    if isinstance(v, dict):
        return {k: interpolate(x) for k, x in v.items()}
    if isinstance(v, list):
        return [interpolate(x) for x in v]
    if not isinstance(v, str):
        return v

    def sub(m):
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        val = os.environ.get(name)
        if m.group(3) == ":-" and not val:
            return m.group(4)
        if m.group(3) == "-" and val is None:
            return m.group(4)
        if (m.group(3) == ":?" and not val) or (m.group(3) == "?" and val is None):
            sys.exit(f"required variable {name} is missing: {m.group(4)}")
        return val or ""

    return VAR.sub(sub, v)


def main(argv):
    verbose = "-v" in argv
    args = [a for a in argv[1:] if a != "-v"]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    schema_path = args[0]
    path = args[1] if len(args) > 1 else os.path.join(os.path.dirname(__file__), "compose.yaml")
    with open(schema_path) as f:
        schema = json.load(f)
    with open(path) as f:
        doc = yaml.safe_load(f)
    doc = interpolate(doc)
    errors = [
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(doc)
    ]
    services = doc.get("services", {})
    networks = set((doc.get("networks") or {}).keys()) | {"default"}
    volumes = set((doc.get("volumes") or {}).keys())
    for name, svc in services.items():
        for n in svc.get("networks") or []:
            if n not in networks:
                errors.append(f"services/{name}/networks: undeclared network {n!r}")
        for v in svc.get("volumes") or []:
            src = v.split(":", 1)[0] if isinstance(v, str) else v.get("source", "")
            if src and not src.startswith((".", "/", "~")) and src not in volumes:
                errors.append(f"services/{name}/volumes: undeclared volume {src!r}")
        deps = svc.get("depends_on") or []
        for d in deps if isinstance(deps, list) else deps.keys():
            if d not in services:
                errors.append(f"services/{name}/depends_on: no service {d!r}")
    if verbose:
        print(json.dumps(doc, indent=2))
    for e in errors:
        print(f"{path}: {e}", file=sys.stderr)
    if not errors:
        print(f"{path}: valid ({len(services)} services: {', '.join(services)})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
