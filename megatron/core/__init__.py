"""The library: layers, models, parallel state, optimizer; no argparse, no globals beyond the rank grid."""
