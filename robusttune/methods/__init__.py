"""What the map measures: the defences and the attacks on them.

- `aggregators`  robust aggregation rules (registry AGGREGATORS): median, Krum, trimmed mean, SWB ...
- `attacks`      Byzantine attacks (registry ATTACKS), the rule-aware ones included
- `algorithms`   server algorithms (registry ALGORITHMS): FedAvg, SWB-DM's cache, DeMoA ... and
                 their server-side caches
- `adversary`    the worst-case adversary made of the attacks and their strength ladders, shared
                 by maps, calibration and tuning; `adaptive`: its strength search
"""
