package main

import (
	"encoding/xml"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The legend sits above the plot: none of its entries overlaps the area
// where the lines are drawn, whatever the data.
func TestChartLegendDoesNotCoverTheData(t *testing.T) {
	start := time.Unix(1000, 0)
	ss := []series{
		{Label: "node1 nic1 tx", Points: [][2]float64{{1, 10}, {30, 400}}},
		{Label: "node1 nic2 tx", Points: [][2]float64{{1, 10}, {30, 400}}},
	}
	var b strings.Builder
	if err := writeSVG(&b, "demo", ss, []phase{{Name: "agent", Start: start, End: start.Add(30 * time.Second)}}, start); err != nil {
		t.Fatal(err)
	}
	var svg struct {
		Rects []struct {
			Y      string `xml:"y,attr"`
			Height string `xml:"height,attr"`
			Fill   string `xml:"fill,attr"`
		} `xml:"rect"`
		Texts []struct {
			Y    string `xml:"y,attr"`
			Body string `xml:",chardata"`
		} `xml:"text"`
	}
	if err := xml.Unmarshal([]byte(b.String()), &svg); err != nil {
		t.Fatal(err)
	}
	plotTop := -1.0
	for _, r := range svg.Rects {
		if r.Fill == "#f2f2f2" { // the phase's shading spans the plot's height
			plotTop, _ = strconv.ParseFloat(r.Y, 64)
		}
	}
	if plotTop < 0 {
		t.Fatal("no phase shading found")
	}
	found := 0
	for _, text := range svg.Texts {
		if !strings.HasPrefix(text.Body, "node1 nic") {
			continue
		}
		found++
		if y, _ := strconv.ParseFloat(text.Y, 64); y >= plotTop {
			t.Errorf("legend entry %q at y %v, inside the plot (from y %v)", text.Body, y, plotTop)
		}
	}
	if found != len(ss) {
		t.Fatalf("%d legend entries, want %d", found, len(ss))
	}
}
