#!/usr/bin/env python3
"""A model of the handshakes of src/ops/cuda/attention_gqa_wgmma.cu, run over random interleavings.

The kernel's producer (a BF16 cache's copying warp, or an FP8 cache's warpgroup) and its two
consumer warpgroups meet through four mbarriers a stage (full and empty, for K and for V apart)
and the named barriers 3 and 4 by which the consumers take turns to issue their MMAs. Each agent
below is a generator that yields wherever the kernel's threads could be descheduled; every
wait, arrive and parity is the kernel's. For 0 to 12 tiles and many interleavings it asserts:
no deadlock, no part of a stage overwritten while a consumer reads it, none read before it holds
that tile, and the turns balanced at the end. It also shows that 2 stages deadlock the BF16
producer (which hands tile it - 1 over only after issuing tile it), as the kernel's comment says.

    python3 tools/wgmma_attention_handshakes.py
"""
import random

def run(n, S, fp8, seed):
    rnd = random.Random(seed)
    mk = lambda cnt: [dict(phase=0, pend=cnt, cnt=cnt) for _ in range(S)]
    # The empties count one arrival a consumer warpgroup (the kernel: one a warp, 8 in all).
    full_k, full_v, empty_k, empty_v = mk(1), mk(1), mk(2), mk(2)
    def arrive(b):
        b['pend'] -= 1
        assert b['pend'] >= 0
        if b['pend'] == 0: b['phase'] += 1; b['pend'] = b['cnt']
    def done(b, parity): return (b['phase'] & 1) != parity
    nb = {3: dict(arr=0, gen=0), 4: dict(arr=0, gen=0)}
    data = {'k': [None] * S, 'v': [None] * S}
    reading = {'k': [set() for _ in range(S)], 'v': [set() for _ in range(S)]}
    def nb_arrive(i):
        nb[i]['arr'] += 1
        if nb[i]['arr'] == 2: nb[i]['arr'] = 0; nb[i]['gen'] += 1
    def wait_mb(b, parity):
        while not done(b, parity): yield
    def write(part, st, it):
        assert not reading[part][st], ('overwrite while read', part, st, it)
        data[part][st] = ('writing', it)
    def producer():
        if n == 0: return
        if not fp8:  # one warp: tile it's copies issued, then tile it - 1 handed over
            for it in range(n):
                st = it % S
                if it >= S:
                    yield from wait_mb(empty_k[st], (it // S - 1) & 1)
                    yield from wait_mb(empty_v[st], (it // S - 1) & 1)
                write('k', st, it); write('v', st, it); yield
                if it > 0:
                    p = (it - 1) % S
                    data['k'][p] = data['v'][p] = ('ready', it - 1)
                    arrive(full_k[p]); arrive(full_v[p]); yield
            p = (n - 1) % S
            data['k'][p] = data['v'][p] = ('ready', n - 1)
            arrive(full_k[p]); arrive(full_v[p])
        else:  # the warpgroup: K widened and handed over, then V
            for it in range(n):
                st = it % S
                if it >= S: yield from wait_mb(empty_k[st], (it // S - 1) & 1)
                write('k', st, it); yield
                data['k'][st] = ('ready', it); arrive(full_k[st]); yield
                if it >= S: yield from wait_mb(empty_v[st], (it // S - 1) & 1)
                write('v', st, it); yield
                data['v'][st] = ('ready', it); arrive(full_v[st]); yield
    def wait_turn(wg):
        i = 3 + wg
        g = nb[i]['gen']
        nb_arrive(i)
        while nb[i]['gen'] == g: yield
    def give_turn(wg): nb_arrive(3 + (1 - wg))
    def read(part, st, it, who):
        assert data[part][st] == ('ready', it), (part, st, it, data[part][st])
        reading[part][st].add(who)
    def consumer(wg):
        if n == 0: return
        if wg == 1: give_turn(wg)
        yield from wait_mb(full_k[0], 0)
        yield from wait_turn(wg)
        read('k', 0, 0, (wg, 0)); yield
        give_turn(wg); yield
        reading['k'][0].discard((wg, 0)); arrive(empty_k[0]); yield      # wait<0>: S(0) done
        for it in range(1, n):
            st, prev = it % S, (it - 1) % S
            yield from wait_mb(full_k[st], (it // S) & 1)
            yield from wait_mb(full_v[prev], ((it - 1) // S) & 1)
            yield from wait_turn(wg)
            read('k', st, it, (wg, it)); read('v', prev, it - 1, (wg, it - 1)); yield
            give_turn(wg); yield
            reading['k'][st].discard((wg, it)); arrive(empty_k[st]); yield          # wait<1>: S(it) done
            reading['v'][prev].discard((wg, it - 1)); arrive(empty_v[prev]); yield  # wait<0>: PV(it-1) done
        last = (n - 1) % S
        yield from wait_mb(full_v[last], ((n - 1) // S) & 1)
        yield from wait_turn(wg)
        read('v', last, n - 1, (wg, n - 1)); yield
        if wg == 0: give_turn(wg)
        reading['v'][last].discard((wg, n - 1)); arrive(empty_v[last])
    agents = [producer(), consumer(0), consumer(1)]
    alive = [True] * 3
    steps = 0
    while any(alive):
        steps += 1
        if steps > 200000: raise Exception('deadlock n=%d S=%d fp8=%s' % (n, S, fp8))
        i = rnd.choice([k for k in range(3) if alive[k]])
        try: next(agents[i])
        except StopIteration: alive[i] = False
    assert nb[3]['arr'] == 0 and nb[4]['arr'] == 0, nb
    return True

for fp8, S in ((False, 3), (True, 2)):
    for n in range(0, 13):
        for seed in range(300):
            run(n, S, fp8, seed)
print('ok: bf16 with 3 stages, fp8 with 2 stages, 0-12 tiles, 300 interleavings each')
for fp8, S in ((False, 2),):
    try:
        for seed in range(50): run(5, S, fp8, seed)
        print('fp8=%s S=%d: no deadlock seen' % (fp8, S))
    except Exception as e: print('expected:', e)
