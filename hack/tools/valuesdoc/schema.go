package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// schema is the part of a JSON schema (draft-07) the reference shows.
type schema struct {
	Ref         string   `json:"$ref"`
	Description string   `json:"description"`
	Type        typeList `json:"type"`
	Enum        []any    `json:"enum"`
	Pattern     string   `json:"pattern"`
	Minimum     *float64 `json:"minimum"`
	Maximum     *float64 `json:"maximum"`
	MinItems    *int     `json:"minItems"`
	UniqueItems bool     `json:"uniqueItems"`
	Items       *schema  `json:"items"`
	// Properties keep the schema's order: the reference lists keys as the
	// schema (and values.yaml) do, not alphabetically.
	Properties           properties         `json:"properties"`
	AdditionalProperties json.RawMessage    `json:"additionalProperties"`
	Definitions          map[string]*schema `json:"definitions"`
}

// typeList is "type": a name or a list of names.
type typeList []string

func (t *typeList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*t = typeList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*t = many
	return nil
}

func (t typeList) String() string { return strings.Join(t, " or ") }

type property struct {
	name   string
	schema *schema
}

type properties []property

func (p *properties) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("properties: %w", err)
	}
	if tok != json.Delim('{') {
		return fmt.Errorf("properties: want an object, got %v", tok)
	}
	for dec.More() {
		tok, err = dec.Token()
		if err != nil {
			return err
		}
		name, ok := tok.(string)
		if !ok {
			return fmt.Errorf("properties: key %v is not a string", tok)
		}
		var s schema
		if err := dec.Decode(&s); err != nil {
			return fmt.Errorf("properties.%s: %w", name, err)
		}
		*p = append(*p, property{name: name, schema: &s})
	}
	return nil
}

// resolve follows a local reference (#/definitions/NAME). A description
// written next to the reference (ignored by draft-07 validators, kept for
// readers) wins over the definition's.
func (root *schema) resolve(s *schema) (*schema, error) {
	if s.Ref == "" {
		return s, nil
	}
	name, ok := strings.CutPrefix(s.Ref, "#/definitions/")
	if !ok {
		return nil, fmt.Errorf("reference %q is not local", s.Ref)
	}
	def, ok := root.Definitions[name]
	if !ok {
		return nil, fmt.Errorf("reference %q: no such definition", s.Ref)
	}
	def, err := root.resolve(def)
	if err != nil {
		return nil, err
	}
	resolved := *def
	if s.Description != "" {
		resolved.Description = s.Description
	}
	return &resolved, nil
}
