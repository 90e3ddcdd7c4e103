"""The Colab notebook runs top to bottom on CPU in its smoke mode (the tiny test model, a few steps):
it trains, resumes from its checkpoint, samples and plots."""

import nbformat
import pytest
from conftest import REPO, subprocess_env
from nbclient import NotebookClient


@pytest.mark.slow
def test_colab_notebook_runs_in_smoke_mode(tmp_path, data_dir, monkeypatch):
    notebook = nbformat.read(REPO / "launch" / "colab.ipynb", as_version=4)
    workdir = tmp_path / "run"
    monkeypatch.setenv("XLA_FLAGS", subprocess_env()["XLA_FLAGS"])  # one CPU device, as a Colab CPU runtime
    monkeypatch.setenv("LM_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("LM_REPO_DIR", str(REPO))
    monkeypatch.setenv("LM_NOTEBOOK_WORKDIR", str(workdir))
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "cpu: 1 x cpu" in text  # the device probe
    assert "step      6 | loss" in text and "resumed from step 6" in text and "step     12 | loss" in text
    assert "ROMEO:" in text  # `lm sample`'s output
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the loss curves
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["12", "9"]
