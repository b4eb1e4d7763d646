#!/usr/bin/env python3
"""Writes the .meta files Unity needs beside each file and folder of this package (an immutable
package, one added by git URL or from a tarball, ignores assets without one), with GUIDs derived
from the path so that they never change, and the native plugins' platform settings: which editor
and player loads each library. Run by build.sh --unity-plugins; tests/test_csharp.py checks that
the committed ones are complete. Samples~ is not imported by Unity (the trailing ~), so it needs none.
Usage: python3 unity_meta.py [--check]"""
import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Plugins/<folder>: (editor OS, CPU, the Standalone build target) for each native library
PLUGINS = {"Linux/x86_64": ("Linux", "x86_64", "Linux64"), "Linux/ARM64": ("Linux", "ARM64", "Linux64"),
           "Windows/x86_64": ("Windows", "x86_64", "Win64")}
TAIL = "  userData: \n  assetBundleName: \n  assetBundleVariant: \n"


def guid(rel):
    return hashlib.md5(("com.fastllm.fastllm/" + rel).encode()).hexdigest()


def meta_text(path):
    rel = path.relative_to(HERE).as_posix()
    head = f"fileFormatVersion: 2\nguid: {guid(rel)}\n"
    if path.is_dir():
        return head + "folderAsset: yes\nDefaultImporter:\n  externalObjects: {}\n" + TAIL
    if path.suffix == ".cs":
        return (head + "MonoImporter:\n  externalObjects: {}\n  serializedVersion: 2\n  defaultReferences: []\n"
                "  executionOrder: 0\n  icon: {instanceID: 0}\n" + TAIL)
    if path.suffix == ".asmdef":
        return head + "AssemblyDefinitionImporter:\n  externalObjects: {}\n" + TAIL
    if path.name == "package.json":
        return head + "PackageManifestImporter:\n  externalObjects: {}\n" + TAIL
    folder = path.parent.relative_to(HERE / "Plugins").as_posix() if "Plugins" in path.parts else None
    if folder in PLUGINS:
        os_name, cpu, target = PLUGINS[folder]
        return (head + "PluginImporter:\n  externalObjects: {}\n  serializedVersion: 2\n  iconMap: {}\n"
                "  executionOrder: {}\n  defineConstraints: []\n  isPreloaded: 0\n  isOverridable: 0\n"
                "  isExplicitlyReferenced: 0\n  validateReferences: 1\n  platformData:\n"
                "  - first:\n      Any: \n    second:\n      enabled: 0\n      settings: {}\n"
                f"  - first:\n      Editor: Editor\n    second:\n      enabled: 1\n      settings:\n"
                f"        CPU: {cpu}\n        DefaultValueInitialized: true\n        OS: {os_name}\n"
                f"  - first:\n      Standalone: {target}\n    second:\n      enabled: 1\n      settings:\n"
                f"        CPU: {cpu}\n" + TAIL)
    return head + "DefaultImporter:\n  externalObjects: {}\n" + TAIL


def assets():
    """What Unity imports: package.json, README, Runtime/ and Plugins/ (what they hold)."""
    out = [HERE / "package.json", HERE / "Runtime"]
    out += sorted(p for p in (HERE / "Runtime").rglob("*") if not p.name.endswith(".meta"))
    plugins = HERE / "Plugins"
    if plugins.exists():
        out += [plugins] + sorted(p for p in plugins.rglob("*") if not p.name.endswith(".meta"))
    return out


def main():
    check = "--check" in sys.argv
    stale = []
    for path in assets():
        meta = path.with_name(path.name + ".meta")
        text = meta_text(path)
        if not meta.exists() or meta.read_text() != text:
            stale.append(meta)
            if not check:
                meta.write_text(text)
    if check and stale:
        print("missing or stale .meta files (run python3 bindings/csharp/unity_meta.py):")
        for m in stale:
            print("  " + str(m.relative_to(HERE)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
