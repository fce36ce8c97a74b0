-- Argo CD health of a CdnPurge (cluster.anevia.com/v1), from status.phase (Pending, Purging,
-- Complete, Failed), observedGeneration and the Ready condition, whose message says what was
-- purged, which pod keeps it waiting and why, or why it cannot be applied.
-- Runs in Argo CD's sandbox: no string library, only base and table functions.
local hs = {}

local function condition(status, type)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local status = obj.status
if status == nil or status.phase == nil then
  -- A purge that completes within seconds gets its first status then, Complete.
  hs.status = "Progressing"
  hs.message = "Waiting for cdn-operator to apply the purge"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for cdn-operator to observe generation " .. tostring(generation)
  return hs
end

local ready = condition(status, "Ready")
if status.phase == "Complete" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Every pod applied the purge")
elseif status.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = describe(ready, describe(condition(status, "Stalled"), "The purge cannot be applied"))
elseif status.phase == "Purging" then
  hs.status = "Progressing"
  hs.message = describe(ready, "Applying the purge to the pods")
elseif status.phase == "Pending" then
  hs.status = "Progressing"
  hs.message = describe(ready, "Waiting for cdn-operator to apply the purge")
else
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. tostring(status.phase)
end
return hs
