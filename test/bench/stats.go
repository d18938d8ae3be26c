package main

import "slices"

// Every table of the benchmark uses one statistic for all its contenders:
// a contender's p50 (or p99) is the median over rounds of each round's own
// p50 (p99), whether the round's samples are ours or sockperf's (which
// reports percentiles, not samples); throughput is the median over rounds.
// A ratio's headline is the median of the per-round ratios: each round
// runs every contender back to back, so that the machine's drift between
// rounds cancels out.

// rounds gathers one contender's rounds.
type rounds struct {
	p50, p99, min []float64
	samples, lost int
}

// add records one round's samples (sorted).
func (r *rounds) add(sorted []float64, lost int) {
	r.p50 = append(r.p50, pct(sorted, 50))
	r.p99 = append(r.p99, pct(sorted, 99))
	r.min = append(r.min, pct(sorted, 0))
	r.samples += len(sorted)
	r.lost += lost
}

// addPercentiles records a round known only by its percentiles.
func (r *rounds) addPercentiles(p50, p99, min float64, samples int) {
	r.p50, r.p99, r.min = append(r.p50, p50), append(r.p99, p99), append(r.min, min)
	r.samples += samples
}

// result summarizes the rounds.
func (r *rounds) result(id, name string) Result {
	res := Result{ID: id, Name: name, Samples: r.samples, Lost: r.lost,
		RoundsP50us: r.p50, RoundsP99us: r.p99}
	if len(r.p50) > 0 {
		res.P50us, res.P99us, res.MinUs = round3(median(r.p50)), round3(median(r.p99)), slices.Min(r.min)
	}
	return res
}

func medianRatio(a, b []float64) float64 {
	n := min(len(a), len(b))
	if n == 0 {
		return 0
	}
	r := make([]float64, n)
	for i := range n {
		r[i] = a[i] / b[i]
	}
	return median(r)
}

// median is the middle value (the mean of the two middle ones for an even
// count).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// pct is the p-th percentile of sorted values (nearest rank).
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)))
	return sorted[min(i, len(sorted)-1)]
}

func round3(v float64) float64 { return float64(int(v*1000+0.5)) / 1000 }
