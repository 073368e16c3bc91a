#!/usr/bin/env bash
# Installs the npm packages the Kubernetes manifest checks use (kubernetes-models,
# yaml) into tests/k8s/node_modules, from the npm registry, pinned by
# package-lock.json. Idempotent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
if [[ -d node_modules/kubernetes-models && -d node_modules/yaml &&
      node_modules/.package-lock.json -nt package-lock.json ]]; then
  echo "k8s install: node_modules up to date"
  exit 0
fi
command -v npm >/dev/null || { echo "k8s install: npm is required" >&2; exit 1; }
npm ci --no-audit --no-fund --loglevel=error
