"""The Colab notebook runs top to bottom on CPU in its smoke mode (the tiny test model, a few steps):
it trains, resumes from its checkpoint, samples and plots; and the notebook as saved shows a whole
run's outputs."""

import re

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


def test_saved_notebook_shows_a_trained_model_a_sample_and_the_loss_curves():
    """The saved outputs are a Colab user's first sight of lm: the trained model's result line, whose
    val loss the first cell quotes, a sample after the prompt, the loss curves, and no temporary paths."""
    notebook = nbformat.read(REPO / "launch" / "colab.ipynb", as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = [output for cell in code for output in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")

    results = re.findall(r"^done: eval loss (\d\.\d+) at step (\d+)", text, re.MULTILINE)
    assert len(results) == 2, "the first training run and the resumed one each end with their result line"
    assert f"val loss {results[-1][0][:4]}" in notebook.cells[0].source
    sample_cell = next(cell for cell in code if '"lm", "sample"' in cell.source)
    sample = "".join(o.get("text", "") for o in sample_cell.outputs if o.output_type == "stream")
    assert sample.startswith("ROMEO:") and len(sample) > 300
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert "/tmp/" not in text
