"""The core's folders are its layers: each #include in libfastllm/ must follow an edge that
docs/architecture.md's layer table allows ("depends on"), so the table and the code cannot drift
apart, and the allowed edges themselves must run one way (no cycle)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORE = REPO / "libfastllm"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_table():
    """{folder: set of folders it may include}, read from docs/architecture.md."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    allowed = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"`[a-z]+/`", cells[0]):
            continue
        deps = cells[-1]
        allowed[cells[0].strip("`/")] = set() if deps == "nothing" else set(re.findall(r"`([a-z]+)/?`", deps))
    return allowed


def includes():
    """(file, folder, included folder) for every quoted include of another core folder."""
    for path in sorted(CORE.rglob("*")):
        if path.suffix not in (".h", ".cpp", ".c"):
            continue
        folder = path.relative_to(CORE).parts[0]
        for target in INCLUDE.findall(path.read_text(errors="replace")):
            if "/" in target:
                yield path.relative_to(REPO), folder, target.split("/", 1)[0]


def test_the_table_names_every_folder_and_only_folders():
    allowed = layer_table()
    folders = {p.name for p in CORE.iterdir() if p.is_dir()}
    assert set(allowed) == folders, (sorted(allowed), sorted(folders))
    for folder, deps in allowed.items():
        assert deps <= folders, (folder, deps - folders)
        assert folder not in deps


def test_the_allowed_edges_run_one_way():
    allowed = layer_table()
    done, path = set(), []

    def visit(folder):
        assert folder not in path, "cycle: " + " -> ".join(path + [folder])
        if folder in done:
            return
        path.append(folder)
        for dep in allowed[folder]:
            visit(dep)
        path.pop()
        done.add(folder)

    for folder in allowed:
        visit(folder)


def test_every_include_follows_an_allowed_edge():
    allowed = layer_table()
    bad = [f"{path}: {folder}/ includes {target}/" for path, folder, target in includes()
           if target != folder and target not in allowed.get(folder, set())]
    assert not bad, "\n".join(bad)


def test_the_scan_finds_the_edges_and_the_runtime_names_no_backend():
    # The include scan is not vacuous: it finds the edges the table has to allow.
    edges = {(folder, target) for _, folder, target in includes() if folder != target}
    assert ("runtime", "arch") in edges and ("cpu", "arch") in edges and ("platform", "base") in edges
    assert ("runtime", "cpu") not in edges  # the runtime names no concrete backend
