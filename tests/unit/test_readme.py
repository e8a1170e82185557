"""The README: its Python example runs as written, and it stays a short entry point."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readmes_python_example_runs_verbatim(tmp_path, monkeypatch, capsys):
    (code,) = re.findall(r"```python\n(.*?)```", README, re.S)[:1]
    monkeypatch.chdir(tmp_path)  # it saves runs/tiny-py
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    printed = re.fullmatch(r"P@1 ([0-9.]+)  P@5 ([0-9.]+)\n", capsys.readouterr().out)
    assert printed, "the example prints one line of figures"
    # tiny: 500 labels; the most frequent label alone scores about 0.05
    assert float(printed.group(1)) > 0.2
    assert (tmp_path / "runs" / "tiny-py" / "config.toml").is_file()


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    assert len(README.splitlines()) < 150
    first_block = README.split("```")[1]
    assert [line.split()[0] for line in first_block.strip().splitlines()] == ["./scripts/demo.sh", "./scripts/test.sh"]
    for name in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / name).is_file(), name
    assert "python -m scripts.plot_run" not in README


def test_every_figure_in_the_readme_names_its_script():
    figures = README.split("## Figures", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n- ", figures)[1:]
    assert items
    for item in items:
        assert "scripts/" in item and ("Synthetic" in item or "real" in item), item
