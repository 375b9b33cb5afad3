# kiln: `make demo` and `make test` bootstrap everything they need.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
APT_PKGS := gcc make binutils gcc-arm-none-eabi libnewlib-arm-none-eabi gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libopenblas-dev lld chromium

.PHONY: demo test lint typecheck unit apt clean wheel

$(STAMP): pyproject.toml requirements.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements.txt
	$(VPY) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VPY) -m kiln.demo

apt:
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; fi; \
	fi

lint: $(STAMP)
	$(VPY) -m ruff check src tests bench
	$(VPY) -m mypy

# Bytecode first: where PYTHONDONTWRITEBYTECODE is set (CI images set it), every process
# the tests start (CLI runs, fresh-process loads, doc blocks) would otherwise compile
# kiln's sources anew, about 1.5 s each.
unit: $(STAMP)
	$(VPY) -m compileall -q -j 0 src tests > /dev/null
	$(VPY) -m pytest tests -n auto --dist loadgroup --durations=60

test: apt lint unit

# The API reference, generated from the docstrings of the public names.
.PHONY: docs
docs: $(STAMP)
	$(VPY) -m pdoc -o build/api kiln

# The wheel (dist/kiln_tensor-*.whl), with the setuptools of .venv: no download.
wheel: $(STAMP)
	$(VPY) -m pip wheel -q --no-deps --no-build-isolation -w dist .

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
