#!/usr/bin/env python3
"""Writes the OLM bundle and catalog of a release (docs/upgrading.md, the policy it applies).

  bundle_release.py bundle VERSION --image cdn-operator=REPO@sha256:… --image nginx=REPO@sha256:…
                    [--previous PREVIOUS] [--root DIR]
      bundle/manifests' CSV becomes cdn-operator.vVERSION: spec.version, spec.replaces (the
      previous release in the channel: PREVIOUS, default the CSV's current version),
      olm.skipRange ">=0.1.0 <VERSION", createdAt (SOURCE_DATE_EPOCH, else now), and every image
      (containerImage, the Deployment's, RELATED_IMAGE_* env, relatedImages) pinned by digest.
      Each relatedImage by name needs an --image; nginx-metrics is the operator's own image.
  bundle_release.py catalog VERSION --bundle-image REPO@sha256:… [--root DIR]
      olm/catalog gets the entry of that bundle (built from bundle/ after the step above) in the
      default channel (replaces, skipRange as in the CSV) and its olm.bundle, with the properties
      opm renders; earlier bundles are kept as released.

Edits are textual, so that comments and layout stay; the result is parsed and checked before
anything is written, and nothing is written on an error. Needs python3 and PyYAML.
"""
import argparse
import datetime
import os
import re
import sys

import yaml

import artifact_checks

CSV = "bundle/manifests/cdn-operator.clusterserviceversion.yaml"
ANNOTATIONS = "bundle/metadata/annotations.yaml"
# The first release: every later one skips the versions from it on (one-step upgrades).
FIRST = "0.1.0"
DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
FROZEN_NOTE = "# The properties of {name} as released (generated from its bundle then).\n"


def fail(message):
    sys.exit(f"bundle_release: {message}")


def semver(v):
    m = SEMVER.match(v)
    if not m:
        fail(f"{v!r} is not a release version (MAJOR.MINOR.PATCH)")
    return tuple(int(x) for x in m.groups())


def read(path):
    with open(path) as f:
        return f.read()


def replace_line(text, pattern, new, what):
    out, n = re.subn(pattern, new, text, count=1, flags=re.M)
    if n != 1:
        fail(f"{CSV}: no {what} to write")
    return out


def images_of(csv):
    """Every image reference the CSV carries, with where it is."""
    found = [("metadata.annotations.containerImage", csv["metadata"]["annotations"].get("containerImage", ""))]
    for image in csv["spec"].get("relatedImages", []):
        found.append((f"spec.relatedImages[{image['name']}]", image["image"]))
    for d in csv["spec"]["install"]["spec"]["deployments"]:
        pod = d["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            found.append((f"deployment {d['name']} container {c['name']}", c["image"]))
            for e in c.get("env", []):
                if e["name"].startswith("RELATED_IMAGE_"):
                    found.append((f"deployment {d['name']} env {e['name']}", e.get("value", "")))
    return found


def bundle(args):
    version = args.version
    csv_text = read(CSV)
    csv = yaml.safe_load(csv_text)
    current = csv["spec"]["version"]
    previous = args.previous or current
    if semver(version) <= semver(previous):
        fail(f"{version} is not after the previous release {previous}")
    package = csv["metadata"]["name"].split(".v")[0]
    given = {}
    for item in args.image:
        name, sep, ref = item.partition("=")
        if not sep or not DIGEST.match(ref):
            fail(f"--image {item!r}: expected NAME=REPOSITORY@sha256:<64 hex digits> (a pushed image's digest)")
        given[name] = ref
    operator_old = csv["metadata"]["annotations"]["containerImage"]
    operator_new = given.get(package)
    if not operator_new:
        fail(f"--image {package}=…@sha256:… is required (the operator's image)")
    # Old reference -> new: the operator's image wherever it appears (the nginx-metrics sidecar
    # runs it too), then each relatedImage by name.
    pins = {operator_old: operator_new}
    names = set()
    for image in csv["spec"].get("relatedImages", []):
        names.add(image["name"])
        new = given.get(image["name"]) or (operator_new if image["image"] == operator_old else None)
        if not new:
            fail(f"relatedImage {image['name']} ({image['image']}) needs --image {image['name']}=…@sha256:…")
        if pins.setdefault(image["image"], new) != new:
            fail(f"{image['image']} would be pinned to both {pins[image['image']]} and {new}")
    unknown = set(given) - names - {package}
    if unknown:
        fail(f"--image for no relatedImage of the CSV: {', '.join(sorted(unknown))}")

    created = datetime.datetime.fromtimestamp(int(os.environ.get("SOURCE_DATE_EPOCH") or
                                                  datetime.datetime.now().timestamp()),
                                              datetime.timezone.utc)
    text = csv_text
    # Longest first: a reference that is a prefix of another is not replaced inside it.
    for old in sorted(pins, key=len, reverse=True):
        text = re.sub(re.escape(old) + r"(?![\w.:@/-])", pins[old], text)
    text = re.sub(rf"^(# OLM registry\+v1 bundle of {re.escape(package)} ){re.escape(current)}\.",
                  rf"\g<1>{version}.", text, count=1, flags=re.M)
    text = replace_line(text, rf"^(  name: ){re.escape(package)}\.v\S+$", rf"\g<1>{package}.v{version}", "metadata.name")
    text = replace_line(text, r"^(    createdAt: ).*$", rf'\g<1>"{created:%Y-%m-%dT%H:%M:%SZ}"', "createdAt")
    text = replace_line(text, r"^(    olm\.skipRange: ).*$", rf'\g<1>">={FIRST} <{version}"', "olm.skipRange")
    text = re.sub(r"^  replaces: .*\n", "", text, flags=re.M)
    text = replace_line(text, r"^  version: \S+$",
                        f"  version: {version}\n  # The previous release of the channel (docs/upgrading.md).\n"
                        f"  replaces: {package}.v{previous}", "spec.version")

    out = yaml.safe_load(text)
    if (out["metadata"]["name"], out["spec"]["version"], out["spec"].get("replaces")) != \
            (f"{package}.v{version}", version, f"{package}.v{previous}"):
        fail("the written CSV does not name the release (a layout this script does not know)")
    loose = [f"{where}: {ref}" for where, ref in images_of(out) if not DIGEST.match(ref)]
    if loose:
        fail("images left without a digest:\n  " + "\n  ".join(loose))
    with open(CSV, "w") as f:
        f.write(text)
    print(f"wrote {CSV}: {package}.v{version} replaces {package}.v{previous}, "
          f"skipRange >={FIRST} <{version}, {len(pins)} images by digest")


def catalog(args):
    if not DIGEST.match(args.bundle_image):
        fail(f"--bundle-image {args.bundle_image!r}: expected REPOSITORY@sha256:<64 hex digits>")
    csv = yaml.safe_load(read(CSV))
    name, version = csv["metadata"]["name"], csv["spec"]["version"]
    if version != args.version:
        fail(f"{CSV} is version {version}, not {args.version}: run the bundle step first")
    replaces = csv["spec"].get("replaces")
    skip_range = csv["metadata"]["annotations"].get("olm.skipRange")
    annotations = yaml.safe_load(read(ANNOTATIONS))["annotations"]
    channels = annotations["operators.operatorframework.io.bundle.channels.v1"].split(",")
    text = read(artifact_checks.CATALOG)
    docs = [d for d in yaml.safe_load_all(text) if d]
    if any(d.get("schema") == "olm.bundle" and d["name"] == name for d in docs):
        fail(f"{artifact_checks.CATALOG} already has {name}")
    bundles = [d for d in docs if d.get("schema") == "olm.bundle"]
    if not bundles or artifact_checks.PROPERTIES_NOTE not in text:
        fail(f"{artifact_checks.CATALOG}: no generated bundle to follow")
    for channel in channels:
        doc = next((d for d in docs if d.get("schema") == "olm.channel" and d["name"] == channel), None)
        if doc is None:
            fail(f"{artifact_checks.CATALOG}: no channel {channel} (bundle/metadata/annotations.yaml)")
        if replaces and replaces not in {e["name"] for e in doc["entries"]}:
            fail(f"channel {channel} has no {replaces} for {name} to replace")
    # The last bundle's properties stay as they were generated; the new bundle's follow.
    head, _, tail = text.rpartition(artifact_checks.PROPERTIES_NOTE)
    text = head + FROZEN_NOTE.format(name=bundles[-1]["name"]) + tail
    entry = f"  - name: {name}\n" + (f"    replaces: {replaces}\n" if replaces else "") + \
        (f'    skipRange: "{skip_range}"\n' if skip_range else "")
    for channel in channels:
        # The channel's entries end where its document does.
        m = re.search(rf"^schema: olm\.channel\n(?:.*\n)*?name: {re.escape(channel)}\n(?:(?!---\n).*\n)*",
                      text, flags=re.M)
        if not m:
            fail(f"{artifact_checks.CATALOG}: channel {channel} is not laid out as schema, package, name, entries")
        text = text[:m.end()] + entry + text[m.end():]
    related = "".join(f"  - name: {i['name']}\n    image: {i['image']}\n" for i in csv["spec"].get("relatedImages", []))
    text += (f"---\nschema: olm.bundle\nname: {name}\npackage: {bundles[-1]['package']}\n"
             f"image: {args.bundle_image}\nrelatedImages:\n  - name: \"\"\n    image: {args.bundle_image}\n"
             f"{related}{artifact_checks.PROPERTIES_NOTE}properties: []\n")
    # Checked before writing: the YAML parses, and the channel holds the entry.
    docs = [d for d in yaml.safe_load_all(text) if d]
    for channel in channels:
        doc = next(d for d in docs if d.get("schema") == "olm.channel" and d["name"] == channel)
        if name not in {e["name"] for e in doc["entries"]}:
            fail(f"channel {channel}: the entry of {name} was not written")
    with open(artifact_checks.CATALOG, "w") as f:
        f.write(text)
    artifact_checks.catalog_properties("--write")
    print(f"wrote {artifact_checks.CATALOG}: {name} in {', '.join(channels)}, bundle {args.bundle_image}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                        help="the repository (or a copy of its bundle/ and olm/)")
    sub = parser.add_subparsers(dest="step", required=True)
    b = sub.add_parser("bundle")
    b.add_argument("version")
    b.add_argument("--previous")
    b.add_argument("--image", action="append", default=[], metavar="NAME=REPOSITORY@sha256:…")
    c = sub.add_parser("catalog")
    c.add_argument("version")
    c.add_argument("--bundle-image", required=True)
    args = parser.parse_args()
    semver(args.version)
    os.chdir(args.root)
    {"bundle": bundle, "catalog": catalog}[args.step](args)


if __name__ == "__main__":
    main()
