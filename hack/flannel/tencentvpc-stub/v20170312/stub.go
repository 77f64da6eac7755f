// Package v20170312 is the part of the Tencent Cloud VPC client that
// flannel's tencent-vpc backend calls, each call failing: see ../go.mod.
package v20170312

import "errors"

var errStub = errors.New("tencent-vpc backend not built in (stub of the Tencent Cloud VPC SDK)")

type Client struct{}

func NewClientWithSecretId(secretID, secretKey, region string) (*Client, error) {
	return &Client{}, errStub
}

type Filter struct {
	Name   *string
	Values []*string
}

type Route struct {
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteType            *string
	Enabled              *bool
	RouteId              *uint64
}

type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

type DescribeRouteTablesRequest struct{ Filters []*Filter }

type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest {
	return &DescribeRouteTablesRequest{}
}

func (*Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errStub
}

type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type DeleteRoutesResponse struct{}

func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }

func (*Client) DeleteRoutes(*DeleteRoutesRequest) (*DeleteRoutesResponse, error) { return nil, errStub }

type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type CreateRoutesResponse struct{}

func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

func (*Client) CreateRoutes(*CreateRoutesRequest) (*CreateRoutesResponse, error) { return nil, errStub }
