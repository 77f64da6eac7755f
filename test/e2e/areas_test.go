package e2e

import "testing"

// The end-to-end tests, by area: `go test -run TestFailover ./test/e2e/` runs
// one area, `-run TestFailover/GrayFailure` the tests of it whose names
// begin so. Areas that measure rates and stalls or load the machine
// (TestFailover, TestRate, TestIntegrity) run their tests one at a time;
// the functional areas run theirs side by side (go test -parallel), each on
// a bed of its own, and so does TestChart, whose two clusters at the
// chart's default liveness probes need the machine to themselves. Go runs
// the areas one after another, so that each area's tests share the machine
// only with their own kind (TestKube's agents probe liveness slowly enough
// for two clusters, not for other areas' transfers beside them).
// `make test` runs the functional ones beside other packages and the
// others alone on the machine afterwards (docs/testing.md).

// Failover: a NIC fails mid-transfer (carrier, gray failures, removal) and the
// connection's longest stall, its goodput during the failure and the path's
// return are measured. Stalls are measured one test at a time.
func TestFailover(t *testing.T) {
	t.Run("CarrierLossMidTransferStallsBriefly", testCarrierLossMidTransferStallsBriefly)
	t.Run("GrayFailureMidTransferIsFoundByProbes", testGrayFailureMidTransferIsFoundByProbes)
	t.Run("CarrierLossOnOneOfThreePaths", testCarrierLossOnOneOfThreePaths)
	t.Run("GrayFailuresOnOneOfThreePaths", testGrayFailuresOnOneOfThreePaths)
	t.Run("NICRemovedMidTransferIsReattached", testNICRemovedMidTransferIsReattached)
	t.Run("ActivePathLostMidTransferGoesOnOverTheBackupPath", testActivePathLostMidTransferGoesOnOverTheBackupPath)
	t.Run("SignalModeSubflowsRideTheDetourThroughAGrayFailure", testSignalModeSubflowsRideTheDetourThroughAGrayFailure)
}

// Rates: caps (police, shape, window, per pod, a path's capacity, a live
// connection's cap while policies come and go, the last two through the
// API on real nodes), the agent's throughput against hand-written routing
// and a long transfer's stalls with the defaults, measured one test at a
// time.
func TestRate(t *testing.T) {
	t.Run("PoliceCapsWhatThePodSends", testPoliceCapsWhatThePodSends)
	t.Run("PoliceCapsWhatThePodReceives", testPoliceCapsWhatThePodReceives)
	t.Run("ShapeCapsWhatThePodSends", testShapeCapsWhatThePodSends)
	t.Run("ShapePerPodCapHoldsAcrossPaths", testShapePerPodCapHoldsAcrossPaths)
	t.Run("NamespaceCapHoldsForItsPodsTogether", testNamespaceCapHoldsForItsPodsTogether)
	t.Run("WindowCapsWhatThePodReceives", testWindowCapsWhatThePodReceives)
	t.Run("PerPodPoliceCapsEveryProtocol", testPerPodPoliceCapsEveryProtocol)
	t.Run("PoliceCapsWhatAGuestSends", testPoliceCapsWhatAGuestSends)
	t.Run("AgentThroughputMatchesHandRoutedBaseline", testAgentThroughputMatchesHandRoutedBaseline)
	t.Run("SteadyTransferHasNoPeriodicStall", testSteadyTransferHasNoPeriodicStall)
	t.Run("PathCapacityBoundsShapingOnItsNIC", testPathCapacityBoundsShapingOnItsNIC)
	t.Run("LiveConnectionKeepsItsCapWhileAPolicySortingFirstComesAndGoes", testLiveConnectionKeepsItsCapWhileAPolicySortingFirstComesAndGoes)
}

// Integrity: streams compared byte by byte through every stage the bed and
// the product add, with both cores busy; DSS checksums catching a wire
// that changes bytes. One test at a time: they load the machine.
func TestIntegrity(t *testing.T) {
	t.Run("StreamsArriveWhole", testStreamsArriveWhole)
	t.Run("KernelChangesStreams", testKernelChangesStreams)
	t.Run("DataChecksumsCatchWhatAWireChanged", testDataChecksumsCatchWhatAWireChanged)
}

// Steering: subflows placed on distinct NICs, backup paths, joins refused,
// replaced or forged, from captures; a path down towards one peer alone.
// Functional: run side by side.
func TestSteering(t *testing.T) {
	t.Run("SubflowsSpreadOverDistinctNICsInBothDirections", sideBySide(testSubflowsSpreadOverDistinctNICsInBothDirections))
	t.Run("WithoutTheAgentSubflowsAreNotSpread", sideBySide(testWithoutTheAgentSubflowsAreNotSpread))
	t.Run("BackupSubflowIsBackupInThePodAndCarriesAlmostNothing", sideBySide(testBackupSubflowIsBackupInThePodAndCarriesAlmostNothing))
	t.Run("PathMadeBackupMidConnectionIsToldWithMPPrio", sideBySide(testPathMadeBackupMidConnectionIsToldWithMPPrio))
	t.Run("JoinBeyondTheMaximumIsRefusedWithMPTCPRST", sideBySide(testJoinBeyondTheMaximumIsRefusedWithMPTCPRST))
	t.Run("JoinByAnInterfaceOfNoPathIsRefused", sideBySide(testJoinByAnInterfaceOfNoPathIsRefused))
	t.Run("AClosedJoinIsReplacedOnThePathItLeft", sideBySide(testAClosedJoinIsReplacedOnThePathItLeft))
	t.Run("ForgedSYNsMoveNoLiveSubflow", sideBySide(testForgedSYNsMoveNoLiveSubflow))
	t.Run("TrafficToAPeerDownOnAPathGoesRoundItWhileOtherPeersKeepIt", sideBySide(testTrafficToAPeerDownOnAPathGoesRoundItWhileOtherPeersKeepIt))
	t.Run("ShortConnectionsStayOnOnePathLongOnesGetJoinsAfterTheThreshold", sideBySide(testShortConnectionsStayOnOnePathLongOnesGetJoinsAfterTheThreshold))
}

// CNI: the operator on real nodes whose network is another CNI than the
// test bed's ptp, built from its own module and run as its installer runs it
// (docs/install.md, "CNIs", has the matrix). Functional: run side by side.
func TestCNI(t *testing.T) {
	t.Run("flannel-vxlan/SubflowsSpreadOverDistinctNICsAndStreamsArriveWhole", sideBySide(testFlannel("vxlan")))
	t.Run("flannel-host-gw/SubflowsSpreadOverDistinctNICsAndStreamsArriveWhole", sideBySide(testFlannel("host-gw")))
	t.Run("calico-routed/SubflowsSpreadAndNetworkPolicyHolds", sideBySide(testCalico("routed")))
	t.Run("calico-vxlan/SubflowsSpreadAndNetworkPolicyHolds", sideBySide(testCalico("vxlan")))
	t.Run("cilium-native/SubflowsSpreadAndNetworkPolicyHolds", sideBySide(testCilium("native", false)))
	t.Run("cilium-native-bpf-host-routing/SubflowsSteeredAtTheEdgeAndNetworkPolicyHolds", sideBySide(testCilium("native", true)))
	t.Run("cilium-vxlan/OuterPacketsFollowTheirSubflowsAndNetworkPolicyHolds", sideBySide(testCilium("vxlan", false)))
}

// Guest: VM guests in pods, attached as KubeVirt attaches them, whose
// kernels the operator does not configure. Functional: run side by side
// (a guest under software emulation keeps a core busy, which would starve
// other areas' transfers: the areas run one after another).
func TestGuest(t *testing.T) {
	t.Run("GuestClientSubflowsSpreadOverDistinctNICs", sideBySide(testGuestClientSubflowsSpreadOverDistinctNICs))
	t.Run("GuestServerSubflowsSpreadOverDistinctNICs", sideBySide(testGuestServerSubflowsSpreadOverDistinctNICs))
	t.Run("GuestHoldsTheJoinOnABackupPathAsBackup", sideBySide(testGuestHoldsTheJoinOnABackupPathAsBackup))
	t.Run("GuestIsToldOfAPathMadeBackupWithMPPrio", sideBySide(testGuestIsToldOfAPathMadeBackupWithMPPrio))
	t.Run("GuestJoinBeyondTheMaximumIsRefusedWithMPTCPRST", sideBySide(testGuestJoinBeyondTheMaximumIsRefusedWithMPTCPRST))
	t.Run("GuestConnectionGoesOnThroughAFailedPath", sideBySide(testGuestConnectionGoesOnThroughAFailedPath))
}

// Agent: its life on a node (kill, restart, upgrade, bad configuration,
// observe-only, capabilities, pods leaving) in file mode. Functional: run
// side by side.
func TestAgent(t *testing.T) {
	t.Run("ScrapedPathBytesMatchNICCounters", sideBySide(testScrapedPathBytesMatchNICCounters))
	t.Run("AgentKilledMidTransferRestartsWithoutDisturbingConnections", sideBySide(testAgentKilledMidTransferRestartsWithoutDisturbingConnections))
	t.Run("PodRemovedFromConfigLeavesNothingBehind", sideBySide(testPodRemovedFromConfigLeavesNothingBehind))
	t.Run("PodRemovedWhileTheAgentIsDownIsReleasedAfterRestart", sideBySide(testPodRemovedWhileTheAgentIsDownIsReleasedAfterRestart))
	t.Run("BadConfigIsReportedAndTheLastGoodOneStaysEnforced", sideBySide(testBadConfigIsReportedAndTheLastGoodOneStaysEnforced))
	t.Run("AgentHoldsOnlyItsDeclaredCapabilities", sideBySide(testAgentHoldsOnlyItsDeclaredCapabilities))
	t.Run("ObserveOnlyRecordsWithoutSteeringUntilSwitchedOff", sideBySide(testObserveOnlyRecordsWithoutSteeringUntilSwitchedOff))
	t.Run("PodReleasedWhileItsPeerStaysSelectedKeepsItsConnections", sideBySide(testPodReleasedWhileItsPeerStaysSelectedKeepsItsConnections))
	t.Run("UpgradeFromPreviousReleaseMigratesMapsUnderTraffic", sideBySide(testUpgradeFromPreviousReleaseMigratesMapsUnderTraffic))
	t.Run("UpgradeWhoseFirstReconcileFailsRollsBack", sideBySide(testUpgradeWhoseFirstReconcileFailsRollsBack))
}

// Kube: the operator installed by its chart on real nodes (kubelet,
// containerd) and driven through the API server: policies, paths, pods
// and agents coming and going, the contract from CRD to datapath.
// Functional: run side by side, their agents probing liveness slowly
// enough not to be starved (kubeBedValues).
func TestKube(t *testing.T) {
	t.Run("PolicyFromTheAPIIsEnforcedReportedAndWithdrawnCleanly", sideBySide(testPolicyFromTheAPIIsEnforcedReportedAndWithdrawnCleanly))
	t.Run("AgentsKilledWhileThePolicyChangesResumeUndisturbed", sideBySide(testAgentsKilledWhileThePolicyChangesResumeUndisturbed))
	t.Run("PodDeletedFromTheAPILeavesNothingBehind", sideBySide(testPodDeletedFromTheAPILeavesNothingBehind))
	t.Run("DefaultRoleBackupMakesAPathBackupWhereAPolicySaysNothing", sideBySide(testDefaultRoleBackupMakesAPathBackupWhereAPolicySaysNothing))
	t.Run("TenantPreferenceActsInEverySpreadMode", sideBySide(testTenantPreferenceActsInEverySpreadMode))
	t.Run("RaisedMaxSubflowsReachesRunningPods", sideBySide(testRaisedMaxSubflowsReachesRunningPods))
	t.Run("ExplainAndAlertsNameWhatLimitsSubflows", sideBySide(testExplainAndAlertsNameWhatLimitsSubflows))
	t.Run("InstalledFromARegistryAsAnAdminWould", sideBySide(testInstalledFromARegistryAsAnAdminWould))
}

// Chart: what an admin does with helm: install, spread, uninstall without a
// trace; upgrade from the previous release under traffic. Each from
// nothing, on beds of their own, side by side: the chart's default probes
// (30 ms) hold with two clusters on the machine, not beside other areas.
func TestChart(t *testing.T) {
	t.Run("ChartInstalledAsAnAdminDoesSpreadsAndUninstallsWithoutATrace", sideBySide(testChartInstalledAsAnAdminDoesSpreadsAndUninstallsWithoutATrace))
	t.Run("HelmUpgradeUnderTrafficReplacesAgentsOneNodeAtATime", sideBySide(testHelmUpgradeUnderTrafficReplacesAgentsOneNodeAtATime))
}

// sideBySide runs test in parallel with the other parallel tests of its
// area (at most go test -parallel at once).
func sideBySide(test func(*testing.T)) func(*testing.T) {
	return func(t *testing.T) {
		t.Parallel()
		test(t)
	}
}
