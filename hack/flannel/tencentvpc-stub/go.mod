// A stand-in for github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc,
// which the Go module proxy does not serve (403, "This module version is not
// available", for v1.3.188 that flannel v0.28.10 requires). flanneld imports
// its tencent-vpc backend unconditionally; the bed never selects it. Every
// call fails.
module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc

go 1.26.0
