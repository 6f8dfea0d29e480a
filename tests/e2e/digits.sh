#!/bin/sh
# The digits MLP passes 90% validation accuracy (the full recipe reaches more).
. "$(dirname "$0")/lib.sh"
digits=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
[ -f "$digits" ] || skip "python3-sklearn is not installed (it ships the digits data)"
"$TRAINRUN" "$TR_SRCDIR/recipes/digits-mlp.lua" --quiet
acc=$(last_metric runs/digits-mlp/metrics.jsonl val_accuracy)
echo "digits: validation accuracy $acc"
less_than 0.90 "$acc" || fail "validation accuracy $acc is below 0.90"
echo "digits: ok"
