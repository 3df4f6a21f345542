# %% [markdown]
# # Comparing hubness reduction methods (a notebook in plain Python)
#
# Run it cell by cell in Jupyter or VS Code (`# %%` marks the cells), or as a
# script: `python examples/compare_methods.py [data-samples/]`. It loads
# embeddings, compares every method hubnorm can run on them, and shows the
# hubness plot: the HTML report inline in a notebook, a text table elsewhere.

# %%
import os
import sys
import tempfile

import hubnorm

data = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "data-samples"
path = lambda name: os.path.join(data, f"{name}.parquet")
scratch = tempfile.mkdtemp(prefix="hubnorm-example-")

# %% [markdown]
# Every method the inputs allow (a gallery bank adds the dual-bank ones),
# each with its defaults, hubness at k = 10.

# %%
comparison = hubnorm.compare(
    path("queries"), path("gallery"), path("bank"),
    gallery_bank=path("gallery_bank"),
    html=os.path.join(scratch, "compare.html"),
    progress=False,
)
print(f"left out: {comparison.left_out or 'nothing'}")

# %% [markdown]
# One row per method: hubness measures (`skewness` of the k-occurrence,
# `hub_occurrence`, `gini`, ...) and quality (`recall_at_1`, `mrr`, with
# bootstrap intervals), and each one's change against the baseline.

# %%
table = comparison.table
print(f"{'method':<32} {'skewness':>9} {'R@1':>7} {'MRR':>7}")
for row in table.select(["label", "skewness", "recall_at_1", "mrr"]).to_pylist():
    print(f"{row['label']:<32} {row['skewness']:9.3f} {100 * row['recall_at_1']:7.2f} "
          f"{row['mrr']:7.4f}")

# %% [markdown]
# The hubness plot: the HTML page `compare` wrote (k-occurrence histograms,
# recall bars, the hubs), inline in a notebook.

# %%
try:
    from IPython import get_ipython
    from IPython.display import HTML, display
    in_notebook = get_ipython() is not None
except ImportError:
    in_notebook = False
if in_notebook:
    display(HTML(open(comparison.html, encoding="utf-8").read()))
else:
    print(f"the hubness plot: open {comparison.html} in a browser")
