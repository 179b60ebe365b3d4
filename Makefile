# Two entry points, both self-installing on a fresh machine:
#   make demo   trains a small CNN on the 8x8 digits with every convolution computed by convgrad
#   make test   installs convgrad with its test extras and the peer frameworks, runs the tests
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-fast fuzz fuzz-long conformance-long bench bench-dask install install-peers clean docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# setup.py compiles the native engine (src/convgrad/kernels/native/) at install time.
$(VENV)/.installed: pyproject.toml setup.py $(wildcard src/convgrad/kernels/native/*) | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

# Extras are installed by tools/install_extras.py: `pip install -e '.[extra]'` would
# rebuild the package (and compile the engine again) for every extra.
$(VENV)/.peers: $(VENV)/.installed
	$(BIN)/python tools/install_extras.py peers cli bench dask
	touch $@

# The demo's extras (matplotlib for the loss curve, scikit-learn's bundled digits).
$(VENV)/.cli: $(VENV)/.installed
	$(BIN)/python tools/install_extras.py cli
	touch $@

install: $(VENV)/.installed

install-peers: $(VENV)/.peers

demo: $(VENV)/.cli
	$(BIN)/convgrad demo

# The API reference built from the docstrings (Sphinx + numpydoc), warnings as errors.
$(VENV)/.docs: $(VENV)/.installed
	$(BIN)/python tools/install_extras.py docs
	touch $@

docs: $(VENV)/.docs
	$(BIN)/python -m sphinx -b html -W -n --keep-going -q docs/api docs/_build/html
	@echo "API reference: docs/_build/html/index.html"

# The conformance tests compare with PyTorch, TensorFlow, OpenVINO and the oneDNN Graph
# library: installed here, with Sphinx (tests/test_api_docs.py builds the API reference).
test: install-peers $(VENV)/.docs
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# Without the peer frameworks (their conformance modules are skipped).
test-fast: $(VENV)/.cli
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# The benchmark against the peers (about 30 min on 2 cores).
# BENCH_ARGS adds options,
# e.g. BENCH_ARGS="--layers r50_res2_3x3 --repeat 3".  Results: benchmarks/results/.
bench: install-peers
	$(BIN)/python -m convgrad.bench --dtypes float32 float16 bfloat16 $(BENCH_ARGS)

# convgrad.dask on LocalClusters: scaling with workers and bytes moved (about 5 min), then
# the 3-D spec example's per-worker memory (about 3 min, 7 GB RAM, 3 GB disk).
# Results: benchmarks/results/dask_{scaling,3d}.md.
bench-dask: install-peers
	$(BIN)/python benchmarks/dask_scaling.py
	$(BIN)/python benchmarks/dask_3d.py

# Long property-based runs (not part of make test): the same properties, more examples.
fuzz: install
	CONVGRAD_FUZZ_EXAMPLES=$${CONVGRAD_FUZZ_EXAMPLES:-3000} \
	CONVGRAD_PROPERTY_EXAMPLES=$${CONVGRAD_PROPERTY_EXAMPLES:-3000} \
	$(BIN)/python -m pytest -q -n 2 tests/test_robustness.py tests/test_properties.py

# Open-ended fuzzing through Hypothesis' fuzz_one_input (random bytes, hang watchdog).
fuzz-long: install
	$(BIN)/python tests/fuzz_convgrad.py --target both --seconds $${FUZZ_SECONDS:-600}

# The conformance modules with more random cases: PyTorch, TensorFlow and OpenVINO
# CONFORMANCE_SCALE times as many, the oneDNN Graph library ONEDNN_CASES per op.
conformance-long: install-peers
	CONVGRAD_CONFORMANCE_SCALE=$${CONFORMANCE_SCALE:-20} \
	CONVGRAD_ONEDNN_CASES=$${ONEDNN_CASES:-1000} \
	$(BIN)/python -m pytest -q -n 2 tests/test_conformance_torch.py tests/test_conformance_tf.py \
	    tests/test_conformance_openvino.py tests/test_conformance_onednn_graph.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
	rm -f src/convgrad/kernels/_engine_*.so
