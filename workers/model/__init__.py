"""The policy interface and its model adapters (the MiniGenEval pixel policy), pretraining, the shipped base."""
