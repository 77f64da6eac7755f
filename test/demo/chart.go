package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// phase is a stretch of the demo run (one scenario's transfer).
type phase struct {
	Name       string
	Start, End time.Time
}

// series is one NIC's transmit rate over time, in Mbit/s.
type series struct {
	Label  string
	Points [][2]float64 // seconds since start, Mbit/s
}

// rates turns cumulative counter samples of node's NICs into per-interval
// transmit rates.
func rates(samples []testbed.Sample, node int, start time.Time) []series {
	byNIC := map[int][]testbed.Sample{}
	for _, s := range samples {
		if s.Node == node {
			byNIC[s.NIC] = append(byNIC[s.NIC], s)
		}
	}
	nics := make([]int, 0, len(byNIC))
	for k := range byNIC {
		nics = append(nics, k)
	}
	sort.Ints(nics)
	var out []series
	for _, k := range nics {
		ss := byNIC[k]
		sr := series{Label: fmt.Sprintf("node%d nic%d tx", node, k)}
		for i := 1; i < len(ss); i++ {
			dt := ss[i].Time.Sub(ss[i-1].Time).Seconds()
			if dt <= 0 {
				continue
			}
			mbps := float64(ss[i].TxBytes-ss[i-1].TxBytes) * 8 / dt / 1e6
			sr.Points = append(sr.Points, [2]float64{ss[i].Time.Sub(start).Seconds(), mbps})
		}
		out = append(out, sr)
	}
	return out
}

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"}

// writeSVG draws the series as lines over shaded scenario phases. Plain SVG,
// so the chart needs no plotting library and opens in any browser.
func writeSVG(w io.Writer, title string, ss []series, phases []phase, start time.Time) error {
	// The legend has a row of its own between the title and the plot, so
	// that it never hides the data (the last scenario, the agent's, ends at
	// the top right).
	const width, height, left, right, top, bottom = 960.0, 440.0, 60.0, 20.0, 60.0, 70.0
	const legendY, legendStep = 44.0, 170.0
	maxT, maxY := 1.0, 100.0
	for _, s := range ss {
		for _, p := range s.Points {
			maxT = max(maxT, p[0])
			maxY = max(maxY, p[1])
		}
	}
	maxY = float64(int(maxY/50)+1) * 50
	x := func(t float64) float64 { return left + t/maxT*(width-left-right) }
	y := func(v float64) float64 { return height - bottom - v/maxY*(height-top-bottom) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15">%s</text>`+"\n", left, escape(title))
	for i, p := range phases {
		x0, x1 := x(p.Start.Sub(start).Seconds()), x(p.End.Sub(start).Seconds())
		fill := "#f2f2f2"
		if i%2 == 1 {
			fill = "#e6eef7"
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x0, top, x1-x0, height-top-bottom, fill)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11">%s</text>`+"\n", (x0+x1)/2, height-bottom+32+float64(i%2)*14, escape(p.Name))
	}
	for v := 0.0; v <= maxY; v += maxY / 5 {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ccc"/>`+"\n", left, width-right, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left-6, y(v)+4, v)
	}
	fmt.Fprintf(&b, `<text x="14" y="%.1f" transform="rotate(-90 14 %.1f)" text-anchor="middle">Mbit/s</text>`+"\n", (top+height-bottom)/2, (top+height-bottom)/2)
	for t := 0.0; t <= maxT; t += 10 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.0fs</text>`+"\n", x(t), height-bottom+16, t)
	}
	for i, s := range ss {
		color := palette[i%len(palette)]
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p[0]), y(p[1])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		lx := left + float64(i)*legendStep
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="12" height="3" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			lx, legendY-4, color, lx+18, legendY, escape(s.Label))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
