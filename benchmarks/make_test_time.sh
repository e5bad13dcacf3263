#!/usr/bin/env bash
# make test's test phase, its suites one after the other (the recipe of 5afd892: 3.9 suite, notebooks, 4.3 suite,
# docs, torch's default threads; its $(MAKE) lines run this Makefile's test-tl4 and docs) and side by side (the
# current recipe), back to back in one clone whose venvs are built, each with a cold model cache (SITE_LENS_CACHE).
# Prints each way's exit status, wall seconds and pytest's summaries; the logs and the machine's used memory,
# sampled every 2 s, are left in OUT.
#   benchmarks/make_test_time.sh /tmp/fresh /tmp/make_test_time > benchmarks/results/make_test_time.txt
set -u
clone=$(cd "$1" && pwd); out=${2:-/tmp/make_test_time}
mkdir -p "$out"
git -C "$clone" show 5afd892:Makefile > "$out/Makefile.sequential"
(while true; do echo "$(date +%s) $(free -m | awk '/Mem:/{print $3}')"; sleep 2; done) > "$out/used_mb.log" &
sampler=$!
for way in sequential parallel; do
  rm -rf "$out/cache_$way"
  if [ "$way" = sequential ]; then mf="$out/Makefile.sequential"; else mf=Makefile; fi
  t0=$(date +%s)
  (cd "$clone" && SITE_LENS_CACHE="$out/cache_$way" make -f "$mf" test > "$out/$way.log" 2>&1)
  rc=$?
  echo "$way: exit $rc, $(( $(date +%s) - t0 )) s; $(grep -E ' (passed|failed)' "$out/$way.log" | sed 's/^\[[^]]*\] //' | tr '\n' ';')"
done
kill "$sampler"
echo "peak used memory over both ways (free -m): $(awk '{print $2}' "$out/used_mb.log" | sort -n | tail -1) MiB"
