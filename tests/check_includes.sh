#!/usr/bin/env bash
# The include rules of DESIGN.md §2 over every C++ source of the tree:
#   services -> teacher, student -> common -> proto, and nothing points back;
#   teacher/ and student/ never include each other;
#   the core (teacher/, student/) has no gRPC; in common/ only common/grpc/;
#   the CLI, the coordinator, the daemon helpers and the job schema never
#   include LibTorch;
# and one rule of the clock: absl::Now() is called only in common/env.cc
# (everything else takes the time from an Env, common/env.h).
# Prints each violation (file:line, the include, the rule) and exits 1 when
# there is one; exits 2 when ROOT lacks a folder a rule names. tests/lint.sh
# runs it, and so does ctest (include_rules).
#
#   tests/check_includes.sh [ROOT]     check ROOT (default: this repository)
#   tests/check_includes.sh --self-test   plant one violation of each rule in
#                                      a scratch tree and check each is caught
set -euo pipefail

if [[ "${1:-}" == "--self-test" ]]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  plant() {  # FILE INCLUDE
    mkdir -p "$scratch/$(dirname "$1")"
    printf '#include "%s"\n' "$2" >>"$scratch/$1"
  }
  plant common/a.cc "teacher/x.h"
  plant common/b.h "services/teacher/teacher_service.h"
  plant teacher/a.cc "student/trainer.h"
  plant teacher/b.cc "grpcpp/grpcpp.h"
  plant student/a.cc "teacher/dump.h"
  plant student/b.cc "specstream/v1/teacher.grpc.pb.h"
  plant student/c.cc "common/grpc/auth.h"
  plant common/transport/a.cc "grpcpp/server.h"
  plant services/cli/a.cc "common/torch/blocks.h"
  plant services/coordinator/a.cc "torch/torch.h"
  plant common/jobspec/a.cc "torch/torch.h"
  planted=11
  printf 'absl::Time t = absl::Now();\n' >"$scratch/teacher/clock.cc"
  mkdir -p "$scratch/services/daemon"  # every ruled folder exists
  # What is allowed stays quiet.
  plant common/grpc/ok.cc "grpcpp/grpcpp.h"
  plant services/teacher/ok.cc "teacher/teacher_core.h"
  plant student/ok.cc "common/transport/contract.h"
  mkdir -p "$scratch/common" && printf 'absl::Time Now() { return absl::Now(); }\n' >"$scratch/common/env.cc"
  found=$("$0" "$scratch" 2>&1 | grep -c '^include rule:' || true)
  clock=$("$0" "$scratch" 2>&1 | grep -c '^clock rule: teacher/clock.cc:1:' || true)
  if [[ "$found" != "$planted" || "$clock" != 1 ]] || "$0" "$scratch" 2>&1 | grep -q 'common/env.cc'; then
    "$0" "$scratch" || true
    echo "check_includes self-test: caught $found of $planted planted include violations" \
      "and $clock of 1 clock violation" >&2
    exit 1
  fi
  # A root without the ruled folders (a wrong ROOT) fails rather than
  # passing with nothing checked.
  mkdir -p "$scratch/empty"
  if "$0" "$scratch/empty" 2>"$scratch/empty.log" ||
    ! grep -q "has no common/" "$scratch/empty.log"; then
    cat "$scratch/empty.log" >&2
    echo "check_includes self-test: a root without the ruled folders passed" >&2
    exit 1
  fi
  echo "check_includes self-test: caught all $planted planted include violations, the clock" \
    "violation, nothing else, and a wrong root"
  exit 0
fi

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
violations=0
missing=0

# rule FOLDER PATTERN WHY [SKIP]: no source under FOLDER (but under
# FOLDER/SKIP) includes a path matching PATTERN (an extended regex anchored
# at the start of the include's path).
rule() {
  local folder=$1 pattern=$2 why=$3 skip=${4:-}
  if [[ ! -d "$root/$folder" ]]; then
    echo "check_includes: $root has no $folder/ (not this repository's root?)" >&2
    missing=$((missing + 1))
    return 0
  fi
  local hit
  while IFS= read -r hit; do
    [[ -n "$skip" && "$hit" == "$folder/$skip/"* ]] && continue
    echo "include rule: $hit: $why" >&2
    violations=$((violations + 1))
  done < <(cd "$root" && grep -rnE --include='*.h' --include='*.cc' \
             "^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<]($pattern)" "$folder" || true)
}

grpc='grpcpp/|grpc/|grpc\+\+/|[^">]*\.grpc\.pb\.h'
torch='torch/|ATen/|c10/|common/torch/|teacher/|student/'
rule common 'teacher/|student/|services/' "common/ includes none of teacher/, student/, services/"
rule teacher 'student/|services/' "teacher/ never includes student/ or services/ (they meet through proto/ and common/)"
rule student 'teacher/|services/' "student/ never includes teacher/ or services/ (they meet through proto/ and common/)"
rule teacher "$grpc|common/grpc/" "the core has no gRPC: its adapters live in services/"
rule student "$grpc|common/grpc/" "the core has no gRPC: its adapters live in services/"
rule common "$grpc" "in common/ only common/grpc/ uses gRPC" grpc
for folder in services/cli services/coordinator services/daemon common/jobspec; do
  rule "$folder" "$torch" "$folder never includes LibTorch or the libraries that link it"
done

# The clock goes through Env: absl::Now() only in common/env.cc.
while IFS= read -r hit; do
  [[ "$hit" == common/env.cc:* ]] && continue
  [[ "$hit" =~ ^[^:]+:[0-9]+:[[:space:]]*// ]] && continue  # a comment
  echo "clock rule: $hit: absl::Now() is called only in common/env.cc; take an Env* (common/env.h)" >&2
  violations=$((violations + 1))
done < <(cd "$root" && grep -rnF --include='*.h' --include='*.cc' 'absl::Now()' \
           common teacher student services 2>/dev/null || true)

if ((missing > 0)); then
  echo "check_includes: $missing ruled folder(s) missing under $root; nothing was checked there" >&2
  exit 2
fi
if ((violations > 0)); then
  echo "check_includes: $violations include(s) or clock call(s) break the rules" >&2
  exit 1
fi
echo "check_includes: include and clock rules hold"
