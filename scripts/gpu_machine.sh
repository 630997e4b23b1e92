#!/usr/bin/env bash
# Run the GPU tests and the GPU benchmarks (docs/gpu.md) on a machine that cannot reach a package index:
# wheels are downloaded on a machine that can, carried over, and installed without the network.
#
#   here:    bash scripts/gpu_machine.sh download     # .whl/ours (our runtime deps), .whl/sf (Sample Factory 2.1.1)
#   there:   source scripts/gpu_machine.sh install    # our deps on PYTHONPATH; ./.sf_python runs Sample Factory
#            bash scripts/gpu_machine.sh all           # everything below, shorter, in one device call
#            bash scripts/gpu_machine.sh tests         # pytest -m gpu; then bench_pong, bench_cartpole, bench_scaling,
#                                                      # bench_learner, bench_graphs, each on its own
#            bash scripts/gpu_machine.sh scores        # Pong to 20 within 3 minutes, 3 seeds (scripts/reproduce.py)
#
# One call of the device tool, with .whl carried: `source scripts/gpu_machine.sh install && bash
# scripts/gpu_machine.sh all`; results land in $OUT. On an H200 with 16 cores (2026-11-26) its stages took,
# with 3 s more per benchmark window than now: Pong's four phases 190 s, CartPole 512x512 against Sample
# Factory 80 s, the learner's ceiling 20 s, the scaling run 110 s, and the GPU tests 210 s in a call of their
# own; about 9.5 minutes together with today's windows, inside the tool's 10 (the graphs stage, added since,
# is not timed there yet: two short scripts). A stage that would start past
# ALL_DEADLINE is skipped and named; it goes on past a stage that fails.
#
# The target machine's Python is 3.12 with torch, numpy 2, psutil, pytest, tensorboard and matplotlib already
# installed (only what it lacks is carried). Sample Factory needs gymnasium 0.29 and numpy 1: they go into a
# separate folder that only ./.sf_python puts on the path, so the two never meet.
# Strict mode only when run: `source ... install` must not leave it in the caller's shell, whose first failing
# command would then end the caller's whole script.
[[ "${BASH_SOURCE[0]}" == "$0" ]] && set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WHEELS=.whl  # ignored (.gitignore): the device tool carries it when asked
PY=3.12

download() {
    local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
                     --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64
                     --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
    local pip=(python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY"
               --implementation cp "${platforms[@]}")
    "${pip[@]}" -d "$WHEELS/ours" gymnasium==1.4.0 farama-notifications==0.0.6 signal-slot-mp==1.0.5 \
        faster-fifo==1.5.2 ale-py==0.12.1 pyzmq==27.3.0
    "${pip[@]}" -d "$WHEELS/sf" sample-factory==2.1.1 gymnasium==0.29.1 numpy==1.26.4 ale-py==0.9.0 \
        tensorboardx==2.6.2.2 colorlog==6.9.0 signal-slot-mp==1.0.5 faster-fifo==1.5.2 \
        farama-notifications==0.0.6
    # MUJOCO=1: MuJoCo too (26 MB; with Sample Factory's wheels the carry nears the tool's 64 MiB, so the
    # cheetah_split stage is run in a call that carries .whl/ours and .whl/mujoco only)
    [[ "${MUJOCO:-}" == 1 ]] && "${pip[@]}" -d "$WHEELS/mujoco" mujoco==4.0.0 mujoco-core==4.0.0 \
        mujoco-studio==4.0.0 glfw==2.11.0 pyopengl==3.1.10
    du -sh "$WHEELS"/*
    echo "carry $WHEELS (the device tool's carry list), then: source scripts/gpu_machine.sh install"
}

install() {
    # setup.py installs the repository's algo/ and envs/ as sf_core.algo and sf_core.envs; without an install
    # (pip's editable build failed there, 2026-11-27), links inside sf_core/ give a plain import the same names
    local folder
    for folder in algo envs; do [[ -e sf_core/$folder ]] || ln -s "../$folder" "sf_core/$folder"; done
    # each folder of wheels carried is installed once per machine (a warm machine keeps what an earlier call did)
    local pip=(python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade)
    if [[ ! -f /tmp/ours_site/.done ]]; then
        "${pip[@]}" --target /tmp/ours_site "$WHEELS"/ours/*.whl && touch /tmp/ours_site/.done
    fi
    if [[ -d "$WHEELS/mujoco" && ! -f /tmp/ours_site/.mujoco_done ]]; then
        "${pip[@]}" --target /tmp/ours_site "$WHEELS"/mujoco/*.whl && touch /tmp/ours_site/.mujoco_done
    fi
    if [[ -d "$WHEELS/sf" && ! -f /tmp/sf_site/.done ]]; then
        "${pip[@]}" --target /tmp/sf_site "$WHEELS"/sf/*.whl
        # ale-py 0.9 (the oldest with a wheel for Python 3.12, ROMs included) registers its envs when imported;
        # gymnasium 0.29 never imports it, so every interpreter of Sample Factory's does at start
        echo 'import importlib.util; importlib.util.find_spec("ale_py") and __import__("ale_py")' > /tmp/sf_site/sitecustomize.py
        touch /tmp/sf_site/.done
    fi
    [[ -f /tmp/sf_site/.done ]] && printf '#!/bin/sh\nPYTHONPATH=/tmp/sf_site exec python3 "$@"\n' > .sf_python \
        && chmod +x .sf_python
    export PYTHONPATH=/tmp/ours_site${PYTHONPATH:+:$PYTHONPATH}
    python3 -c "import torch, gymnasium, numpy; print('ours: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'gymnasium', gymnasium.__version__, 'numpy', numpy.__version__)"
    [[ -x .sf_python ]] && ./.sf_python -c "import importlib.metadata as m, sample_factory, gymnasium, numpy, cv2; print('sample factory', m.version('sample-factory'), 'gymnasium', gymnasium.__version__, 'numpy', numpy.__version__)"
    return 0
}

# The GPU runs of docs/gpu.md, each writing its log and results under $OUT (default ./gpu_out); after install.
OUTDIR=${OUT:-gpu_out}
CORES=$(nproc)

tests() {
    python3 -m pytest -m gpu tests -q -rs 2>&1 | tee "$OUTDIR/gpu_tests.log"
}

bench_pong() {
    python3 scripts/benchmark.py --env=atari_pong --phases=raw,sampling,training,sf --seconds=30 --warmup=10 \
        --num_workers="$CORES" --num_envs_per_worker=16 --extra="--device=cuda" --variant="--mixed_precision=True" \
        --sf_python=./.sf_python --sf_module=sf_examples.atari.train_atari --output="$OUTDIR/pong.json" \
        2>&1 | tee "$OUTDIR/pong.log"
}

bench_cartpole() {
    python3 scripts/benchmark.py --env=CartPole-v1 --encoder_mlp_layers 512 512 --phases=training,sf --seconds=30 \
        --warmup=10 --num_workers="$CORES" --extra="--device=cuda" --sf_python=./.sf_python \
        --output="$OUTDIR/cartpole_512.json" 2>&1 | tee "$OUTDIR/cartpole_512.log"
}

# the learner's ceiling: SGD steps of Pong's model on synthetic data, float32 (eager and replayed as a CUDA
# graph, a step and a dataset's iteration) and bf16
bench_learner_both() {
    python3 scripts/bench_sgd_step.py --env=atari_pong --device=cuda --sgd_cuda_graphs --iteration
    python3 scripts/bench_sgd_step.py --env=atari_pong --device=cuda --mixed_precision
}

bench_learner() {
    bench_learner_both 2>&1 | tee "$OUTDIR/learner.log"
}

bench_graphs_to() {  # graphs of several models (docs/algorithms.md): nodes and train_steps on CUDA streams; offload
    python3 scripts/bench_graph_overlap.py --device=cuda --output="$1/graph_overlap.json"
    python3 scripts/bench_train_steps.py --device=cuda --output="$1/train_steps.json"
    python3 scripts/bench_offload.py --device=cuda --output="$1/offload.json"
    python3 scripts/bench_offload.py --device=cuda --frozen_first=True --output="$1/offload_first.json"
}

bench_graphs() {
    bench_graphs_to "$OUTDIR" 2>&1 | tee "$OUTDIR/graphs.log"
}

# issue 41 on the GPU box: HalfCheetah-v5's actor and critic as two models (the critic at once with the actor, on
# CUDA streams of their own) against its preset's shared body, the learner on the GPU, in turns in one benchmark.
# Needs MuJoCo: `MUJOCO=1 bash scripts/gpu_machine.sh download` here, carry .whl/ours and .whl/mujoco
cheetah_split_to() {
    python3 -c "import mujoco" || { echo "cheetah_split: no mujoco here (download with MUJOCO=1, carry .whl/mujoco)"; return 1; }
    python3 scripts/benchmark.py --env=HalfCheetah-v5 --phases=training --seconds=15 --warmup=5 --rounds=2 \
        --extra="--device=cuda" --num_workers="$CORES" \
        --variant="--split_actor_critic=True --recompute_values=True --overlap_graph_nodes=True" \
        --variant="--split_actor_critic=True --overlap_graph_nodes=True" \
        --work_dir="$1/cheetah_runs" --output="$1/cheetah_split.json"
}

cheetah_split() {
    cheetah_split_to "$OUTDIR" 2>&1 | tee "$OUTDIR/cheetah_split.log"
}

# `all` writes its runs under $ALL_DIR and, after each stage, what the device tool brings back (at most 8 files)
# into $OUTDIR: every stage's results JSON and log in one gpu_all.tar.gz, plus the summary files. A stage that
# would start past ALL_DEADLINE seconds is skipped (and named), so the call ends inside the tool's 10 minutes.
ALL_DIR=/tmp/gpu_all
ALL_DEADLINE=${ALL_DEADLINE:-470}

stage() {  # stage NAME COMMAND...: run it unless past the deadline; log under $ALL_DIR; pack what exists so far
    local name=$1; shift
    if (( SECONDS > ALL_DEADLINE )); then skipped+=("$name"); return; fi
    echo "== $name (at ${SECONDS}s)" | tee -a "$ALL_DIR/all.txt"
    "$@" 2>&1 | tee "$ALL_DIR/$name.log" || failed+=("$name")
    cp -f "$ALL_DIR"/*.json "$ALL_DIR"/*.png "$OUTDIR"/ 2>/dev/null || true
    tar czf "$OUTDIR/gpu_all.tar.gz" -C "$ALL_DIR" --exclude='*.pt' --exclude='*.pth' . 2>/dev/null || true
}

all() {
    failed=() skipped=()
    mkdir -p "$ALL_DIR"
    local bench=(python3 scripts/benchmark.py --extra="--device=cuda" --sf_python=./.sf_python)
    # the training phases again with each inference option off or changed, in the same run: --variant
    # PONG_VARIANTS=ale keeps only the ale one, PONG_PHASES=raw,training,sf drops sampling: a shorter pong stage
    local variants=(--variant="--cuda_graphs=False" --variant="--cuda_sync=yield" --variant="--sgd_cuda_graphs=True")
    [[ "${PONG_VARIANTS:-}" == ale ]] && variants=()
    wanted gpu_tests && stage gpu_tests python3 -m pytest -m gpu tests -q -rs -p no:cacheprovider ${GPU_TESTS_K:+-k "$GPU_TESTS_K"}
    # and Pong's splits as ale-py's AtariVectorEnv (issue 38), against the per-env path in the same run
    wanted pong && stage pong "${bench[@]}" --env=atari_pong --phases="${PONG_PHASES:-raw,sampling,training,sf}" \
        --seconds=12 --warmup=6 --num_workers="$CORES" --num_envs_per_worker=16 --sf_module=sf_examples.atari.train_atari "${variants[@]}" \
        --variant="--env_vectorization=ale" \
        ${BASELINE_REPO:+--baseline_repo="$BASELINE_REPO"} \
        --work_dir="$ALL_DIR/pong_runs" --output="$ALL_DIR/pong.json"
    # the better raw ceiling of issue 38: the ale backend's vector env of a split, one process per core
    wanted ale_raw && stage ale_raw python3 scripts/bench_vector_raw.py --processes="$CORES" --seconds=10 \
        --warmup=4 -- --env=atari_pong --env_vectorization=ale --num_workers="$CORES" --num_envs_per_worker=16
    wanted cartpole_512 && stage cartpole_512 "${bench[@]}" --env=CartPole-v1 --encoder_mlp_layers 512 512 \
        --phases=training,sf --seconds=12 --warmup=5 --num_workers="$CORES" "${variants[@]}" \
        --work_dir="$ALL_DIR/cartpole_runs" --output="$ALL_DIR/cartpole_512.json"
    wanted learner && stage learner bench_learner_both
    wanted graphs && stage graphs bench_graphs_to "$ALL_DIR"
    wanted cheetah_split && python3 -c "import mujoco" 2>/dev/null && stage cheetah_split cheetah_split_to "$ALL_DIR"
    wanted scaling && stage scaling "${bench[@]}" --env=atari_pong --scaling=4,8,16 --plot="$ALL_DIR/gpu_scaling.png" \
        --seconds=8 --warmup=6 --work_dir="$ALL_DIR/scaling_runs" --output="$ALL_DIR/scaling.json"
    echo "gpu_machine.sh all: done in ${SECONDS}s; failed stages: ${failed[*]:-none}; skipped past" \
         "${ALL_DEADLINE}s: ${skipped[*]:-none}" | tee -a "$ALL_DIR/all.txt"
    cp -f "$ALL_DIR/all.txt" "$OUTDIR/"
    tar czf "$OUTDIR/gpu_all.tar.gz" -C "$ALL_DIR" --exclude='*.pt' --exclude='*.pth' .
}

# STAGES="pong gpu_tests" runs only those stages of `all` (default: every one); BASELINE_REPO=DIR (a checkout of
# another commit, carried) adds that commit's Pong training to the pong stage, measured in the same run
wanted() {
    [[ -z "${STAGES:-}" || " $STAGES " == *" $1 "* ]]
}

bench_scaling() {
    python3 scripts/benchmark.py --env=atari_pong --scaling=2,4,8,16 --plot="$OUTDIR/gpu_scaling.png" \
        --extra="--device=cuda" --seconds=20 --warmup=10 --output="$OUTDIR/scaling.json" 2>&1 | tee "$OUTDIR/scaling.log"
}

# The published scores on the GPU box (docs/results.md): Pong, 3 seeds, each stopped 3 minutes after its start
# (or at a mean return of 20), through scripts/reproduce.py; its table lands in $OUTDIR/scores_results.md, and
# the JSON, curves, records and logs in $OUTDIR/scores.tar.gz. A seed took 181 s of training and about 210 s with
# start-up and evaluation on an H200 (2026-11-27), so two seeds fit one device call (SCORES_SEEDS=1,2
# SCORES_DEADLINE=470) and the third needs another: SCORES_DEADLINE (seconds for all seeds) stops reproduce.py,
# which writes the table of the seeds done, and the same command on the same warm machine goes on with the rest
# (finished runs are not rerun). SCORES_FRAMES is a run's frame budget (default 40M, CleanRL's, so that time and
# not frames ends a Pong run; the learning rate decays over it). SCORES_ENVS=atari_breakout SCORES_SECONDS=540
# SCORES_SEEDS=1 runs Breakout for 9 minutes instead (not its 40M frames: about 22M at Pong's 42k frames/s).
# SCORES_UPDATES adds trainer flags, e.g. updates per sample other than the preset's (CleanRL's: 4 x 256, 4 epochs).
# SCORES_STICKY is --repeat_action_probability: 0 by default, the deterministic emulator of the NoFrameskip-v4
# envs that the published scores and times to solve were run on; 0.25 for ALE v5's sticky actions.
scores() {
    local work=/tmp/scores
    local updates=${SCORES_UPDATES:-}
    timeout "${SCORES_DEADLINE:-100000}" python3 scripts/reproduce.py --envs="${SCORES_ENVS:-atari_pong}" \
        --seeds="${SCORES_SEEDS:-1,2,3}" --frames="${SCORES_FRAMES:-40000000}" --eval_episodes=3 --out="$work" \
        --extra="--device=cuda --num_workers=$CORES --num_envs_per_worker=16 \
        --train_for_seconds=${SCORES_SECONDS:-180} --target_mean_return=${SCORES_TARGET:-20} \
        --repeat_action_probability=${SCORES_STICKY:-0} $updates" \
        2>&1 | tee "$OUTDIR/scores.log" || true
    # three files back (the device tool brings at most 8): the log, the table, and everything else packed
    cp -f "$work/results.md" "$OUTDIR/scores_results.md" 2>/dev/null || true
    tar czf "$OUTDIR/scores.tar.gz" -C "$work" --exclude=runs . 2>/dev/null || true
}

case "${1:-}" in
    download) download ;;
    install) install ;;
    all|tests|bench_pong|bench_cartpole|bench_scaling|bench_learner|bench_graphs|cheetah_split|scores)
        mkdir -p "$OUTDIR"; "$1" ;;
    *) echo "usage: bash scripts/gpu_machine.sh download | source scripts/gpu_machine.sh install |" \
            "bash scripts/gpu_machine.sh all|tests|bench_pong|bench_cartpole|bench_scaling|bench_learner|bench_graphs|" \
            "cheetah_split|scores" >&2
       return 2 2>/dev/null || exit 2 ;;  # sourced: return, so the caller's shell stays open
esac
