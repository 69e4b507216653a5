#!/bin/sh
# On a lent GPU machine: install tclang's dependencies from wheels carried in .whl (PyCUDA is
# built there from its sdist when no wheel was carried), into /tmp/site. Source it.
set -e
mkdir -p /tmp/site /tmp/wheels
if ! ls .whl/pycuda-*.whl >/dev/null 2>&1; then
  python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/wheels .whl/pycuda-*.tar.gz
  cp /tmp/wheels/pycuda-*.whl "${OUT:-/tmp}/" 2>/dev/null || true
  cp /tmp/wheels/pycuda-*.whl .whl/
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
set +e
