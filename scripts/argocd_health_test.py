#!/usr/bin/env python3
"""Runs the Argo CD health checks of argocd/health/ against their tests, and checks argocd/argocd-cm.yaml.

Each argocd/health/<group>/<Kind>/ holds health.lua, health_test.yaml and testdata/ in Argo CD's
own layout (resource_customizations). Every test object is run through ../shared/tools/argo_health.lua
(Argo CD's Lua sandbox, no string library) and its status and message must be the expected ones.
argocd/argocd-cm.yaml must embed every health.lua byte for byte; `--write` regenerates it.

usage: argocd_health_test.py ARGO_HEALTH_LUA [--write]
"""
import json
import pathlib
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEALTH = ROOT / "argocd" / "health"
CM = ROOT / "argocd" / "argocd-cm.yaml"


def checks():
    return sorted(p.parent for p in HEALTH.glob("*/*/health.lua"))


def render_cm():
    lines = [
        "# Argo CD's health checks for CdnCluster, CdnPurge and At, generated from argocd/health/*/*/health.lua",
        "# by scripts/argocd_health_test.py --write. Merge into the argocd-cm ConfigMap, e.g.",
        "#   kubectl -n argocd patch configmap argocd-cm --type merge --patch-file argocd/argocd-cm.yaml",
        "data:",
    ]
    for d in checks():
        group, kind = d.parent.name, d.name
        lines.append(f"  resource.customizations.health.{group}_{kind}: |")
        for line in (d / "health.lua").read_text().splitlines():
            lines.append(f"    {line}" if line else "")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runner = sys.argv[1]
    if "--write" in sys.argv[2:]:
        CM.write_text(render_cm())
    failures = 0
    found = checks()
    if len(found) < 3:
        print(f"expected health checks for CdnCluster, CdnPurge and At under {HEALTH}, found {found}")
        return 1
    for d in found:
        tests = yaml.safe_load((d / "health_test.yaml").read_text())["tests"]
        if not tests:
            print(f"{d}: no tests")
            failures += 1
        for t in tests:
            obj = yaml.safe_load((d / t["inputPath"]).read_text())
            with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
                json.dump(obj, f)
                f.flush()
                run = subprocess.run(["lua5.1", runner, str(d / "health.lua"), f.name],
                                     capture_output=True, text=True)
            want = t["healthStatus"]
            if run.returncode != 0:
                print(f"FAIL {d.name} {t['inputPath']}: exit {run.returncode}: {run.stderr.strip()}")
                failures += 1
                continue
            got = json.loads(run.stdout)
            if got.get("status") != want["status"] or got.get("message") != want.get("message"):
                print(f"FAIL {d.name} {t['inputPath']}: got {got}, want {want}")
                failures += 1
            else:
                print(f"ok   {d.name} {t['inputPath']}: {got['status']}")
    if not CM.exists() or CM.read_text() != render_cm():
        print(f"FAIL {CM.relative_to(ROOT)} differs from argocd/health/*/*/health.lua: run {sys.argv[0]} {runner} --write")
        failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
