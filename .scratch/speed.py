"""Time the DES at the reference plan."""
import sys
import time

import argparse
from cluster.planner.cli import add_parser
from cluster.planner.cli import inputs_from
from cluster.planner.search import predict

parser = argparse.ArgumentParser()
add_parser(parser.add_subparsers(dest="c"))
args = parser.parse_args(["plan", *sys.argv[1:]])
inputs = inputs_from(args)
t = time.monotonic()
p = predict(inputs, 171, 138)
print(p.simulated, p.ttft_s, time.monotonic() - t)
