#!/usr/bin/env bash
# The master of one sitting on the lent GPU: the steps named as arguments, in order, each logged to /tmp/m (the
# folder wait.sh packs). Started by start.sh in the tree's copy /tmp/r, in its own process session:
#   bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh test-gpu stress:600 verify asv duplex:minicpmo45:exclusive
# Steps:  test-gpu            make test-gpu, its log test-gpu.log
#         verify[:N]          the five verify stages through Ray (N: --max-speak-units N, a limited run), run
#                             folder /tmp/m/$RUN (RUN default: verify); --resume, so a second sitting goes on
#                             from the folder an earlier one brought back (carried as .gpu/$RUN)
#         reproduce[:STAGES][@S] the reproduce stages STAGES (reproduce's --stages; default every one) through Ray
#                             in run folder /tmp/m/$RUN, --resume as verify's, a sitting of at most S seconds
#                             (--budget-s): a complete run spread over several sittings, its folder carried
#         asv                 make asv for the commit .gpu/env.sh names (needs .gpu/shallow.git), results in asv/,
#                             asv machine h200 or h100 after the card
#         stress:SECONDS      the CUDA stress of the four models, 16 threads, quiescent samples every 16 closes,
#                             references first; STRESS_ARGS adds options (e.g. --trace-python 20)
#         duplex:W[:GATE]     the sessions-per-GPU search of workload W on unseen scripts (DuplexCadence, tail only,
#                             60 s per count, threads; DUPLEX_ARGS_W, else DUPLEX_ARGS, replaces "--prepare learned:64
#                             --start 6 --grow 1.5 --budget-s 240"), with DUPLEXCADENCE_CAPTURE_GATE=GATE when given;
#                             out duplex-W[-GATE]/
# Set-up (make setup with WHEELS=.whl, Ray from .whl-ray when a verify step is named) runs first. .gpu/env.sh
# states the commit and impl tree (DUPLEXCADENCE_GIT_REV, DUPLEXCADENCE_IMPL_TREE). /tmp/m/m.log: one line per
# step with its exit status and the seconds since the start; /tmp/m/done when every step has run.
set -u
W=/tmp/m; R=/tmp/r; T0=$(date +%s); RUN=${RUN:-verify}
log() { echo "$(( $(date +%s) - T0 )) s: $*" >> $W/m.log; }
mkdir -p $W; cd $R
. .gpu/env.sh
cp "$0" .gpu/env.sh $W/ 2>/dev/null; echo "$*" > $W/steps.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt 2>&1
# the asv machine: the card this sitting got (an H100 and an H200 keep separate histories)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -o 'H[0-9][0-9]*' | head -1 | tr H h); GPU=${GPU:-gpu}
WHEELS=.whl make setup > $W/setup.log 2>&1 || { log "setup failed"; touch $W/done; exit 1; }
case " $* " in *" verify"*|*" reproduce"*)
  .venv/bin/python -m pip install -q --no-index --find-links .whl-ray --find-links .whl --no-build-isolation \
    -e ".[ray]" > $W/ray-install.log 2>&1 && touch .venv/.ray-stamp ;;
esac
log "setup done"
for step in "$@"; do
  case "$step" in
    test-gpu) timeout 400 make test-gpu GPU_LOG=$W/test-gpu.log > $W/test-gpu.out 2>&1 ;;
    verify|verify:*)
      limit=${step#verify}; limit=${limit#:}
      mkdir -p results
      [ -d .gpu/$RUN ] && [ ! -d $W/$RUN ] && cp -r .gpu/$RUN $W/$RUN      # an earlier sitting's folder, carried
      WHEELS=.whl timeout 900 make reproduce RAY=1 ARGS="--ray local --device cuda --stages '*.verify' --resume \
        --run-dir $W/$RUN ${limit:+--max-speak-units $limit}" > $W/verify-$RUN.log 2>&1 ;;
    reproduce|reproduce:*|reproduce@*)
      rest=${step#reproduce}; rest=${rest#:}; pats=${rest%@*}; b=; [ "$rest" != "$pats" ] && b=${rest##*@}
      mkdir -p results
      [ -d .gpu/$RUN ] && [ ! -d $W/$RUN ] && cp -r .gpu/$RUN $W/$RUN
      WHEELS=.whl timeout $(( ${b:-1500} + 300 )) make reproduce RAY=1 ARGS="--ray local --device cuda --resume \
        --run-dir $W/$RUN ${pats:+--stages '$pats'} ${b:+--budget-s $b}" > $W/reproduce-$RUN.log 2>&1 ;;
    asv)
      GIT_DIR=$R/.gpu/shallow.git WHEELS=.whl timeout 400 make asv ASV_MACHINE=$GPU \
        ARGS="--bench \"time_steady_unit\(.*'cuda'\)\" --show-stderr" > $W/asv.log 2>&1
      rc=$?; mkdir -p $W/asv; cp -r results/asv/results/$GPU results/asv/results/benchmarks.json $W/asv/ 2>/dev/null
      (exit $rc) ;;
    stress:*)
      PYTHONPATH=$R/impl:$R timeout $(( ${step#stress:} + 600 )) .venv/bin/python -m suite.measure.stress \
        --device cuda --threads 16 --seconds "${step#stress:}" --quiesce-every 16 --reference shared-first \
        --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni ${STRESS_ARGS:-} --out $W/stress > $W/stress.log 2>&1 ;;
    duplex:*)
      rest=${step#duplex:}; w=${rest%%:*}; g=; [ "$rest" != "$w" ] && g=${rest#*:}
      own=DUPLEX_ARGS_$w; args=${!own:-${DUPLEX_ARGS:---prepare learned:64 --start 6 --grow 1.5 --budget-s 240}}
      budget=$(echo "$args" | sed -n 's/.*--budget-s \([0-9]*\).*/\1/p')
      env ${g:+DUPLEXCADENCE_CAPTURE_GATE=$g} PYTHONPATH=$R/impl:$R timeout $(( ${budget:-240} + 120 )) \
        .venv/bin/python -m suite.measure.duplex --workload "$w" --device cuda --modes cadence --ar none --seconds 60 \
        --policy threads $args --out $W/duplex-$w${g:+-$g} > $W/duplex-$w${g:+-$g}.log 2>&1 ;;
    *) log "unknown step $step"; false ;;
  esac
  log "$step rc=$?"
done
nvidia-smi > $W/nvidia-smi-end.txt 2>&1
touch $W/done
