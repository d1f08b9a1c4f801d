-- Load 2 rewrites only the partitions its rows fall in (paris), keeping lima and oslo.
{{ config(materialized='incremental', incremental_strategy='insert_overwrite',
          partition_by=['city']) }}
select count(*) * {{ var('load') }} as n, city from {{ ref('people') }}
{% if is_incremental() %} where city = 'paris' {% endif %}
group by city
