"""US states (50 + DC): rough population weights and bounding boxes, for synthetic events."""

from __future__ import annotations

from typing import NamedTuple


class StateBox(NamedTuple):
    """A state's code, relative weight (population in millions, ~2020) and bounding box."""

    code: str
    weight: float
    lat_min: float
    lat_max: float
    lon_min: float
    lon_max: float


# Boxes are the rough extent of each state's mainland (Alaska without the Aleutians west of
# the 180th meridian); good enough to tell states apart, not to draw borders.
STATES: tuple[StateBox, ...] = (
    StateBox("AL", 5.0, 30.22, 35.01, -88.47, -84.89),
    StateBox("AK", 0.7, 54.40, 71.39, -168.00, -130.00),
    StateBox("AZ", 7.2, 31.33, 37.00, -114.82, -109.05),
    StateBox("AR", 3.0, 33.00, 36.50, -94.62, -89.64),
    StateBox("CA", 39.5, 32.53, 42.01, -124.41, -114.13),
    StateBox("CO", 5.8, 36.99, 41.00, -109.06, -102.04),
    StateBox("CT", 3.6, 40.98, 42.05, -73.73, -71.79),
    StateBox("DE", 1.0, 38.45, 39.84, -75.79, -75.05),
    StateBox("DC", 0.7, 38.79, 38.99, -77.12, -76.91),
    StateBox("FL", 21.5, 24.52, 31.00, -87.63, -80.03),
    StateBox("GA", 10.7, 30.36, 35.00, -85.61, -80.84),
    StateBox("HI", 1.5, 18.91, 22.24, -160.25, -154.81),
    StateBox("ID", 1.8, 42.00, 49.00, -117.24, -111.04),
    StateBox("IL", 12.8, 36.97, 42.51, -91.51, -87.50),
    StateBox("IN", 6.8, 37.77, 41.76, -88.10, -84.78),
    StateBox("IA", 3.2, 40.38, 43.50, -96.64, -90.14),
    StateBox("KS", 2.9, 36.99, 40.00, -102.05, -94.59),
    StateBox("KY", 4.5, 36.50, 39.15, -89.57, -81.96),
    StateBox("LA", 4.7, 28.93, 33.02, -94.04, -88.82),
    StateBox("ME", 1.4, 43.06, 47.46, -71.08, -66.95),
    StateBox("MD", 6.2, 37.91, 39.72, -79.49, -75.05),
    StateBox("MA", 7.0, 41.24, 42.89, -73.51, -69.93),
    StateBox("MI", 10.1, 41.70, 48.31, -90.42, -82.41),
    StateBox("MN", 5.7, 43.50, 49.38, -97.24, -89.49),
    StateBox("MS", 3.0, 30.17, 35.00, -91.66, -88.10),
    StateBox("MO", 6.2, 36.00, 40.61, -95.77, -89.10),
    StateBox("MT", 1.1, 44.36, 49.00, -116.05, -104.04),
    StateBox("NE", 2.0, 40.00, 43.00, -104.05, -95.31),
    StateBox("NV", 3.1, 35.00, 42.00, -120.01, -114.04),
    StateBox("NH", 1.4, 42.70, 45.31, -72.56, -70.61),
    StateBox("NJ", 9.3, 38.93, 41.36, -75.56, -73.89),
    StateBox("NM", 2.1, 31.33, 37.00, -109.05, -103.00),
    StateBox("NY", 20.2, 40.50, 45.02, -79.76, -71.86),
    StateBox("NC", 10.4, 33.84, 36.59, -84.32, -75.46),
    StateBox("ND", 0.8, 45.94, 49.00, -104.05, -96.55),
    StateBox("OH", 11.8, 38.40, 41.98, -84.82, -80.52),
    StateBox("OK", 4.0, 33.62, 37.00, -103.00, -94.43),
    StateBox("OR", 4.2, 41.99, 46.29, -124.57, -116.46),
    StateBox("PA", 13.0, 39.72, 42.27, -80.52, -74.69),
    StateBox("RI", 1.1, 41.15, 42.02, -71.86, -71.12),
    StateBox("SC", 5.1, 32.03, 35.22, -83.35, -78.54),
    StateBox("SD", 0.9, 42.48, 45.95, -104.06, -96.44),
    StateBox("TN", 6.9, 34.98, 36.68, -90.31, -81.65),
    StateBox("TX", 29.1, 25.84, 36.50, -106.65, -93.51),
    StateBox("UT", 3.3, 37.00, 42.00, -114.05, -109.04),
    StateBox("VT", 0.6, 42.73, 45.02, -73.44, -71.47),
    StateBox("VA", 8.6, 36.54, 39.47, -83.68, -75.24),
    StateBox("WA", 7.7, 45.54, 49.00, -124.85, -116.92),
    StateBox("WV", 1.8, 37.20, 40.64, -82.64, -77.72),
    StateBox("WI", 5.9, 42.49, 47.08, -92.89, -86.25),
    StateBox("WY", 0.6, 41.00, 45.01, -111.06, -104.05),
)

STATE_BOXES: dict[str, StateBox] = {state.code: state for state in STATES}
